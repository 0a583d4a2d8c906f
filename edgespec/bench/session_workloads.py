"""The sessions benchmark's workloads (``data/sessions.toml``), built with their files.

A workload's conversations are data; the files they open with (Python modules, service
logs, ``grep`` output) are generated from the workload's seed out of the data file's
vocabulary and templates, so that they are realistic, the same on every machine and Python,
and different between a workload's dev and test variants. Sizes are asked in tokens and
made at 4 characters a token. ``edgespec/bench/sessions.py`` runs them.
"""

from __future__ import annotations

import random
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from string import Template

from edgespec.errors import EdgespecError

WORKLOADS = ("alternating", "agent", "agent+chat", "restart")
DATA_FILE = Path(__file__).parent / "data" / "sessions.toml"
CHARS_PER_TOKEN = 4  # the usual rough size of a token of English or code


@dataclass(frozen=True)
class Conversation:
    name: str
    system: str
    turns: tuple[str, ...]  # the user messages, one request each


@dataclass(frozen=True)
class Workload:
    id: str
    kind: str
    split: str
    conversations: tuple[Conversation, ...]
    restart_after: int | None = None  # the server restarts before this round

    @property
    def concurrent(self) -> bool:
        return self.kind == "agent+chat"


def load_workloads(
    split: str = "test", kinds: Iterable[str] = WORKLOADS, path: Path = DATA_FILE
) -> list[Workload]:
    """The workloads of ``kinds`` in ``split`` (dev, test or all), built from ``path``."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        lib, specs = {**data["vocabulary"], **data["templates"]}, data["workloads"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EdgespecError(f"{path}: cannot read the sessions workloads ({e})") from None
    wanted = set(kinds)
    found = []
    for spec in specs:
        try:
            if spec["workload"] not in WORKLOADS or spec["split"] not in ("dev", "test"):
                raise ValueError(f"unknown workload or split: {spec['workload']!r}, {spec['split']!r}")
            if spec["workload"] in wanted and split in ("all", spec["split"]):
                found.append(build_workload(spec, lib))
        except (KeyError, TypeError, ValueError) as e:
            raise EdgespecError(
                f"{path}: workload {spec.get('id', '?')!r}: {type(e).__name__}: {e}"
            ) from None
    return found


def build_workload(spec: dict, lib: dict) -> Workload:
    conversations = tuple(
        build_conversation(c, lib, f"{spec['seed']}:{i}") for i, c in enumerate(spec["conversations"])
    )
    restart = spec.get("restart_after")
    if spec["workload"] == "restart" and not (isinstance(restart, int) and restart >= 1):
        raise ValueError("a restart workload needs restart_after >= 1")
    return Workload(spec["id"], spec["workload"], spec["split"], conversations, restart)


def build_conversation(spec: dict, lib: dict, seed: str) -> Conversation:
    """The conversation's turns with their files generated from ``seed`` (a string seed is
    hashed the same way by every Python), ``${name}``s filled in."""
    rng = random.Random(seed)
    names: dict[str, str] = {}
    own: list[dict[str, str]] = []
    for turn in spec["turns"]:
        if isinstance(turn, str):
            own.append({})
            continue
        text, found = GENERATORS[turn["file"]](rng, lib, int(turn["tokens"]) * CHARS_PER_TOKEN)
        for key, value in found.items():
            names.setdefault(key, value)  # a conversation's first file names it (its opening)
        own.append({**found, "file": text})
    turns = tuple(
        Template(turn if isinstance(turn, str) else turn["text"]).substitute({**names, **mine})
        for turn, mine in zip(spec["turns"], own, strict=True)
    )
    return Conversation(spec["name"], spec["system"], turns)


# ---------------------------------------------------------------- generated files


def _unique(make: Callable[[], str], taken: set[str]) -> str:
    """A name ``make`` makes that is not ``taken`` yet (a numbered one after 20 tries)."""
    name = make()
    for _ in range(20):
        if name not in taken:
            break
        name = make()
    name = name if name not in taken else f"{name}_{len(taken)}"
    taken.add(name)
    return name


def _python(rng: random.Random, lib: dict, chars: int) -> tuple[str, dict[str, str]]:
    """A Python module: the data file's head, then classes and functions over the
    vocabulary's identifiers, until the next block would overshoot ``chars`` further."""

    def pick(key: str) -> str:
        return rng.choice(lib[key])

    module, const = f"{pick('nouns')}_{pick('verbs')}", f"MAX_{plural(pick('nouns')).upper()}"
    head = Template(lib["python_head"]).substitute(
        title=module.replace("_", " ").capitalize(), purpose=pick("purposes"), const=const,
        n=rng.randint(8, 512), timeout=rng.randint(2, 90))  # fmt: skip
    parts, taken = [head], {const}
    classes: list[dict[str, str]] = []  # each class's name and fields, which its functions use
    functions: list[str] = []
    while True:
        is_class = not classes or (len(functions) >= 2 and rng.random() < 0.25)
        if is_class:
            noun = pick("nouns")
            fill = {"cls": _unique(lambda n=noun: n.capitalize() + pick("kinds"), taken), "noun": noun,
                    "key": f"{pick('nouns')}_id", "field": f"{pick('nouns')}_count",
                    "extra": f"{pick('nouns')}_weight", "x": f"{rng.random():.2f}",
                    "method": f"is_{pick('verbs')}able"}  # fmt: skip
            template = lib["python_class"]
        else:
            verb, owner = pick("verbs"), rng.choice(classes)
            fill = {
                **{k: owner[k] for k in ("cls", "noun", "key", "field")},
                "name": _unique(lambda v=verb: f"{v}_{pick('nouns')}", taken),
                "Verb": verb.capitalize(),
                "verb": verb,
                "nouns": plural(owner["noun"]),
                "arg": plural(pick("nouns")),
                "other": f"{pick('nouns')}_id",
            }
            template = rng.choice(lib["python_functions"])
        text = "\n\n" + Template(template).substitute(purpose=pick("purposes"), n=rng.randint(2, 200), **fill)
        size = sum(map(len, parts))
        if len(functions) >= 2 and abs(size + len(text) - chars) > abs(size - chars):
            break  # one more block would land further from the size asked for
        classes.append(fill) if is_class else functions.append(fill["name"])
        parts.append(text)
    names = {"module": module, "path": f"src/{plural(pick('nouns'))}/{module}.py", "const": const}
    return "".join(parts), {**names, "cls": classes[0]["cls"], "func": functions[0], "func2": functions[1]}


def plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


def _log(rng: random.Random, lib: dict, chars: int) -> tuple[str, dict[str, str]]:
    """A service's log: requests, retries, warnings, a few errors with a traceback."""
    service = rng.choice(lib["services"])
    host = f"ip-10-{rng.randint(0, 255)}-{rng.randint(0, 255)}-{rng.randint(1, 254)}.internal"
    clock = datetime(2024, rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23), tzinfo=UTC)
    lines: list[str] = []
    first_error = ""
    while sum(len(line) + 1 for line in lines) < chars:
        clock += timedelta(milliseconds=rng.randint(5, 4000))
        level = rng.choices(("INFO", "DEBUG", "WARN", "ERROR"), weights=(70, 12, 12, 6))[0]
        noun = rng.choice(lib["nouns"])
        text = Template(rng.choice(lib["errors" if level == "ERROR" else "messages"])).substitute(
            noun=noun, nouns=plural(noun), verb=rng.choice(lib["verbs"]), id=rng.randint(1000, 99999),
            ms=rng.randint(3, 9000), bytes=rng.randint(200, 90000), count=rng.randint(1, 500),
            attempt=rng.randint(1, 5), host=host)  # fmt: skip
        who = service if rng.random() < 0.8 else rng.choice(lib["services"])
        stamp = f"{clock:%Y-%m-%dT%H:%M:%S}.{clock.microsecond // 1000:03d}Z"
        lines.append(f"{stamp} {level:<5} {who} [worker-{rng.randint(1, 8)}] {text}")
        if level == "ERROR":
            first_error = first_error or text
            if rng.random() < 0.5:
                lines += Template(lib["traceback"]).substitute(
                    module=who.replace("-", "_"), line=rng.randint(20, 900), verb=rng.choice(lib["verbs"]),
                    error=text).strip("\n").splitlines()  # fmt: skip
    path = f"/var/log/{service}/{service}.log"
    return "\n".join(lines), {"service": service, "host": host, "error": first_error or "none", "path": path}


def _grep(rng: random.Random, lib: dict, chars: int) -> tuple[str, dict[str, str]]:
    """``grep -rn PATTERN src/``: lines of code across files that mention one verb."""
    pattern = rng.choice(lib["verbs"])
    lines: list[str] = []
    while sum(len(line) + 1 for line in lines) < chars:
        noun = rng.choice(lib["nouns"])
        code = Template(rng.choice(lib["grep"])).substitute(
            pattern=pattern, noun=noun, nouns=plural(noun), Noun=noun.capitalize(), n=rng.randint(2, 500)
        )
        where = f"src/{plural(rng.choice(lib['nouns']))}/{noun}_{rng.choice(lib['verbs'])}.py"
        lines.append(f"{where}:{rng.randint(3, 700)}:{code}")
    return "\n".join(lines), {"pattern": pattern}


GENERATORS: dict[str, Callable[[random.Random, dict, int], tuple[str, dict[str, str]]]] = {
    "python": _python,
    "log": _log,
    "grep": _grep,
}
