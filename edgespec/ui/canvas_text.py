"""Editing a file in place: the request that asks the model for a revised file, the file
taken back out of its answer, and what changed, as a count, as HTML and as a unified diff.

Pure text, no model and no Gradio: the app's canvas panel calls these, and the CLI can
reproduce a request exactly (``edit_prompt`` is the one user message, with no system
message: ``edgespec generate --chat --prompt "$(cat prompt)" --prediction FILE``).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from edgespec.ui.files import fenced, file_name

CONTEXT_LINES = 3  # unchanged lines shown around each change, as `diff -u` shows them
ASK = "Reply with the whole revised file and nothing else."
# A fence line: up to three spaces, then three or more backticks or tildes, then an info
# string (a language name) for an opening fence, nothing for a closing one.
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def edit_prompt(name: str, text: str, instruction: str) -> str:
    """The user message asking the model to revise file ``name`` (``text``) as
    ``instruction`` says, answering with the whole file: the file comes first, fenced, so a
    conversation that edits the same file again shares the longest prefix with this one."""
    return f"Here is the file {file_name(name)}:\n{fenced(text)}\n\n{instruction.strip()}\n\n{ASK}"


def edit_messages(name: str, text: str, instruction: str) -> list[dict[str, str]]:
    """The chat messages of that request: one user message and nothing else."""
    return [{"role": "user", "content": edit_prompt(name, text, instruction)}]


# --- the file out of the answer ----------------------------------------------------------


def fenced_blocks(answer: str) -> list[str]:
    """The contents of the fenced code blocks of ``answer``, in order. A block closes on a
    fence of its own character at least as long as the one that opened it (so a file with
    ``` fences of its own, wrapped in ````, stays whole); a block the answer never closes
    (the answer cut off at its token limit) runs to the end."""
    blocks: list[str] = []
    lines = answer.split("\n")
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        i += 1
        if not opening:
            continue
        fence = opening.group(1)
        body: list[str] = []
        while i < len(lines):
            closing = FENCE.match(lines[i])
            i += 1
            if closing and _closes(closing, fence):
                break
            body.append(lines[i - 1])
        blocks.append("\n".join(body))
    return blocks


def _closes(line: re.Match[str], fence: str) -> bool:
    """Whether a fence line closes the block ``fence`` opened: its character, at least as
    long, and no info string (a line like ```python inside is the file's own)."""
    marks, rest = line.group(1), line.group(2)
    return marks[0] == fence[0] and len(marks) >= len(fence) and not rest.strip()


def revision_from_answer(answer: str, original: str) -> str:
    """The revised file in the model's ``answer``: where the answer fences it (with prose
    around it or not), the fenced block most like ``original`` (the share of lines they
    have in common; the longer block on a tie); an answer without fences is the file as it
    stands. Either way it ends as the original ends: with its final newline, or without.

    An original with fence lines of its own (a Markdown file) may come back bare, its own
    fences cut out of it as blocks: there the whole answer is one more candidate."""
    answer = answer.replace("\r\n", "\n").replace("\r", "\n")
    candidates = [(block, True) for block in fenced_blocks(answer)]
    if not candidates or any(FENCE.match(line) for line in original.split("\n")):
        candidates.append((answer, False))
    theirs = _lines(original)
    best, _ = max(
        candidates,
        # Ties (a file rewritten beyond likeness): a block before the whole answer, whose
        # prose is not the file; among blocks, the longer.
        key=lambda item: (_likeness(theirs, _lines(item[0])), item[1], len(item[0])),
    )
    return _ending_like(best, original)


def _likeness(original: list[str], candidate: list[str]) -> float:
    if not original and not candidate:
        return 1.0
    return SequenceMatcher(None, original, candidate, autojunk=False).ratio()


def _ending_like(text: str, original: str) -> str:
    """``text`` with trailing white space replaced by the original's trailing newlines: a
    revision that differs from its file only in a final newline has not changed it."""
    body = text.rstrip()
    if not body:
        return ""
    return body + original[len(original.rstrip("\n")) :]


# --- what changed ------------------------------------------------------------------------


@dataclass(frozen=True)
class Diff:
    """What changed between a file and its revision.

    ``changed`` counts lines: every line of the revision that is new or different, plus
    every line of the original removed without one in its place. Line by line, for each
    run the alignment differs on, that is the larger of the lines it removes and the lines
    it adds: one line edited counts 1, one added 1, one deleted 1, three lines rewritten
    as two counts 3. A file and its revision that differ only in the final newline have 0.

    ``html``: the changes with ``CONTEXT_LINES`` lines around each, as a table of rows
    (class ``diff-del`` removed, ``diff-add`` added, ``diff-same`` context, ``diff-gap``
    lines left out), each with its line numbers, the text escaped. ``unified``: the same
    changes as ``diff -u`` prints them (empty when nothing changed)."""

    changed: int
    html: str
    unified: str


def _lines(text: str) -> list[str]:
    """The lines of ``text``; a final newline ends the last line, it does not start one."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def line_diff(original: str, revised: str, name: str = "file") -> Diff:
    """The changes from ``original`` to ``revised``, line by line (see ``Diff``). ``name``
    labels the unified diff's two sides (``a/NAME``, ``b/NAME``)."""
    old, new = _lines(original), _lines(revised)
    # autojunk off: on files over 200 lines difflib would treat frequent lines (blank ones,
    # closing braces) as junk and align around them badly.
    matcher = SequenceMatcher(None, old, new, autojunk=False)
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")
    groups = list(matcher.get_grouped_opcodes(CONTEXT_LINES)) if changed else []
    return Diff(changed, _html(old, new, groups), _unified(old, new, groups, file_name(name)))


Opcodes = list[tuple[str, int, int, int, int]]


def _unified(old: list[str], new: list[str], groups: list[Opcodes], name: str) -> str:
    if not groups:
        return ""
    out = [f"--- a/{name}", f"+++ b/{name}"]
    for group in groups:
        first, last = group[0], group[-1]
        out.append(f"@@ -{_span(first[1], last[2])} +{_span(first[3], last[4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [f" {line}" for line in old[i1:i2]]
                continue
            out += [f"-{line}" for line in old[i1:i2]]
            out += [f"+{line}" for line in new[j1:j2]]
    return "\n".join(out) + "\n"


def _span(start: int, stop: int) -> str:
    """A hunk's range in the unified format: first line (1-based) and count, the count
    left out when it is 1, and an empty range named by the line before it."""
    count = stop - start
    if count == 1:
        return f"{start + 1}"
    return f"{start + 1 if count else start},{count}"


def _html(old: list[str], new: list[str], groups: list[Opcodes]) -> str:
    if not groups:
        return '<div class="diff diff-none">No changes.</div>'
    rows: list[str] = []
    for number, group in enumerate(groups):
        if number or group[0][1] > 0 or group[0][3] > 0:
            rows.append('<tr class="diff-gap"><td></td><td></td><td>⋯</td></tr>')
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                pairs = zip(range(i1, i2), range(j1, j2), strict=True)
                rows += [_row("diff-same", i + 1, j + 1, " ", old[i]) for i, j in pairs]
                continue
            rows += [_row("diff-del", i + 1, None, "-", old[i]) for i in range(i1, i2)]
            rows += [_row("diff-add", None, j + 1, "+", new[j]) for j in range(j1, j2)]
    last = groups[-1][-1]
    if last[2] < len(old) or last[4] < len(new):
        rows.append('<tr class="diff-gap"><td></td><td></td><td>⋯</td></tr>')
    return f'<table class="diff">{"".join(rows)}</table>'


def _row(kind: str, old_number: int | None, new_number: int | None, mark: str, line: str) -> str:
    old_cell = "" if old_number is None else str(old_number)
    new_cell = "" if new_number is None else str(new_number)
    return (
        f'<tr class="{kind}"><td class="diff-num">{old_cell}</td><td class="diff-num">{new_cell}</td>'
        f'<td class="diff-text">{mark} {html.escape(line)}</td></tr>'
    )


def download_name(name: str) -> str:
    """The name the revised file downloads as: the file's own name, with no folder in it
    (neither kind of separator) and never a name that means a folder."""
    base = file_name(name)
    return "file.txt" if base in ("", ".", "..") else base
