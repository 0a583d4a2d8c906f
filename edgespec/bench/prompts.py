"""The benchmark's built-in prompts, one per category. Short enough for a 2-core CPU,
long enough that each answer is a few hundred tokens."""

from __future__ import annotations

_INVENTORY = '''class Inventory:
    """Tracks stock levels for a small shop."""

    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if name not in self.items:
            raise KeyError(name)
        if self.items[name] < count:
            raise ValueError("not enough stock")
        self.items[name] -= count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())

    def report(self):
        lines = []
        for name in sorted(self.items):
            lines.append(f"{name}: {self.items[name]}")
        return "\\n".join(lines)
'''

_RELEASE_NOTES = """Version 2.4 of the Harbor file synchronisation tool is now available.
The sync engine now detects renamed files instead of deleting and re-uploading them,
which cuts upload volume for large photo libraries by up to 80 percent.
Conflicts between two edited copies are no longer resolved silently: Harbor keeps both
copies and adds the device name to the newer one.
The command line client gained a --dry-run flag that prints every planned change without
touching any file.
Bandwidth limits can now be set per schedule, for example a low limit during office hours
and no limit at night.
Support for Windows 7 has ended; the last version that runs there is 2.3.9.
A memory leak that affected long-running sessions on macOS has been fixed.
The settings file moved from ~/.harbor/config to ~/.config/harbor/config.toml and is
migrated automatically on first start."""

_PASSAGE = """The Great Barrier Reef, off the coast of Queensland in Australia, is the largest
coral reef system in the world. It is made of about 2,900 individual reefs and 900
islands stretching over 2,300 kilometres, and covers an area of roughly 344,400 square
kilometres. The reef was selected as a World Heritage Site in 1981. It is home to more
than 1,500 species of fish, 400 types of hard coral and 4,000 types of mollusc. Rising
sea temperatures have caused mass coral bleaching events, most severely in 2016, 2017,
2020 and 2022. The Great Barrier Reef Marine Park Authority manages the reef and limits
fishing and tourism in protected zones."""

PROMPTS: dict[str, str] = {
    "code writing": (
        "Write a Python function `parse_duration(text)` that converts strings like '1h30m' or "
        "'45s' into a number of seconds, with a docstring, type hints and error handling."
    ),
    "code editing": (
        "Rename the method `total` to `total_units` in the following class, and make `report` "
        "put a dash before each line. Return the complete updated class and nothing else."
        "\n\n```python\n" + _INVENTORY + "```"
    ),
    "summarization": (
        "Summarize the following release notes as a bulleted list with one bullet per change, "
        "keeping the original wording where possible.\n\n" + _RELEASE_NOTES
    ),
    "open chat": "I'm planning a weekend trip to a city I have never visited. What should I think about?",
    "question answering": (
        "Read the passage and answer the questions.\n\n" + _PASSAGE + "\n\nQuestions:\n"
        "1. How many individual reefs make up the Great Barrier Reef?\n"
        "2. When was it selected as a World Heritage Site?\n"
        "3. In which years were the bleaching events?\n"
        "4. Who manages the reef?\n"
        "5. How many types of hard coral live there?\n"
        "6. How long is the reef, and how large an area does it cover?\n"
        "7. What does the managing authority limit in protected zones?"
    ),
}
