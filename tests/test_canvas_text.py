"""Editing a file in place (``edgespec/ui/canvas_text.py``): the one message that asks
for a revision, the file taken back out of the answer however the model wrapped it, and
exactly how many lines changed."""

from __future__ import annotations

import difflib

import pytest

from edgespec.ui.canvas_text import (
    ASK,
    download_name,
    edit_messages,
    edit_prompt,
    fenced_blocks,
    line_diff,
    revision_from_answer,
)

ORIGINAL = "def area(r):\n    return 3.14 * r * r\n\n\nprint(area(2))\n"
REVISED = "import math\n\n\ndef area(r):\n    return math.pi * r * r\n\n\nprint(area(2))\n"


def test_the_edit_request_is_one_user_message_with_the_file_first():
    messages = edit_messages("src/geo.py", ORIGINAL, "  Use math.pi.\n")
    assert messages == [{"role": "user", "content": edit_prompt("src/geo.py", ORIGINAL, "Use math.pi.")}]
    assert messages[0]["content"] == (
        f"Here is the file geo.py:\n```\n{ORIGINAL}```\n\nUse math.pi.\n\n{ASK}"
    )
    assert ASK == "Reply with the whole revised file and nothing else."
    # A file with fences of its own is fenced beyond them.
    assert "\n````\n" in edit_prompt("a.md", "```\nx\n```\n", "Shorter.")


def test_a_fenced_answer_wrapped_in_prose_gives_the_file():
    answer = f"Sure! Here is the revised file:\n\n```python\n{REVISED}```\n\nI replaced 3.14 with math.pi."
    assert revision_from_answer(answer, ORIGINAL) == REVISED
    # Without the prose, and with CRLF line endings: the same file.
    assert revision_from_answer(f"```\n{REVISED}```".replace("\n", "\r\n"), ORIGINAL) == REVISED


def test_of_several_blocks_the_one_most_like_the_file_wins():
    snippet = "```python\nimport math\n```"
    answer = f"First add:\n{snippet}\nThen the whole file:\n```python\n{REVISED}```\nDone."
    assert revision_from_answer(answer, ORIGINAL) == REVISED
    # Whatever order they come in, and however short the file is beside the snippet.
    answer = f"```python\n{REVISED}```\n\nThe key line:\n```\n    return math.pi * r * r\n```"
    assert revision_from_answer(answer, ORIGINAL) == REVISED


def test_a_bare_answer_is_the_file_ending_as_the_original_ends():
    assert revision_from_answer(REVISED.rstrip() + "\n\n  \n", ORIGINAL) == REVISED
    assert revision_from_answer(REVISED.rstrip(), ORIGINAL) == REVISED
    no_newline = ORIGINAL.rstrip("\n")
    assert revision_from_answer(REVISED, no_newline) == REVISED.rstrip("\n")
    assert revision_from_answer("", ORIGINAL) == ""


def test_an_answer_cut_off_inside_its_fence_keeps_what_came():
    answer = "Here it is:\n```python\nimport math\n\n\ndef area(r):"
    assert revision_from_answer(answer, ORIGINAL) == "import math\n\n\ndef area(r):\n"


def test_markdown_with_fences_of_its_own():
    readme = "# Tool\n\nRun it:\n\n```sh\ntool --fast\n```\n\nThat is all.\n"
    revised = readme.replace("--fast", "--faster")
    # Wrapped in a longer fence: the inner fences are the file's.
    assert revision_from_answer(f"Here:\n````markdown\n{revised}````\n", readme) == revised
    assert fenced_blocks(f"````markdown\n{revised}````") == [revised.rstrip("\n")]
    # Bare: the file's own fences are not taken for a wrapper.
    assert revision_from_answer(revised, readme) == revised


@pytest.mark.parametrize(
    ("original", "revised", "changed"),
    [
        ("a\nb\nc\n", "a\nb\nc\n", 0),
        ("a\nb\nc\n", "a\nb\nc", 0),  # only the final newline differs
        ("a\nb\nc\n", "a\nB\nc\n", 1),  # one line edited
        ("a\nb\nc\n", "a\nb\nnew\nc\n", 1),  # one line added
        ("a\nb\nc\n", "a\nc\n", 1),  # one line deleted
        ("a\nx1\nx2\nx3\nb\n", "a\ny1\ny2\nb\n", 3),  # three lines rewritten as two
        ("a\nx\nb\n", "a\ny1\ny2\ny3\nb\n", 3),  # one line rewritten as three
        ("", "one\ntwo\n", 2),
        ("one\ntwo\n", "", 2),
        # Spread over a file: line 2 edited, line 5 deleted, two lines added after line 8.
        ("1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "1\nTWO\n3\n4\n6\n7\n8\nnew a\nnew b\n9\n10\n", 4),
    ],
)
def test_line_diff_counts_exactly_the_changed_lines(original, revised, changed):
    assert line_diff(original, revised).changed == changed


def test_line_diff_html_marks_and_escapes_each_changed_line():
    original = "keep\n<b>old</b>\nkeep too\n"
    diff = line_diff(original, "keep\n<i>new & better</i>\nkeep too\nadded\n")
    assert diff.changed == 2
    assert diff.html.count('class="diff-del"') == 1 and diff.html.count('class="diff-add"') == 2
    assert "&lt;b&gt;old&lt;/b&gt;" in diff.html and "&lt;i&gt;new &amp; better&lt;/i&gt;" in diff.html
    assert "<b>" not in diff.html and "<i>" not in diff.html
    same = line_diff(original, original)
    assert (same.changed, same.unified) == (0, "") and "diff-add" not in same.html


def test_line_diff_unified_is_what_diff_u_prints():
    old = "".join(f"line {n}\n" for n in range(1, 30))
    new = (
        old.replace("line 3\n", "line three\n")
        .replace("line 20\n", "")
        .replace("line 29\n", "line 29\nend\n")
    )
    expected = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/f.txt", "b/f.txt"))
    diff = line_diff(old, new, name="dir/f.txt")
    assert diff.unified == expected
    assert diff.changed == 3
    # Only the changes and their context are shown: far-off unchanged lines are left out.
    assert "line 12<" not in diff.html and diff.html.count('class="diff-gap"') >= 2


def test_download_name_is_the_files_own():
    assert download_name("../../etc/passwd") == "passwd"
    assert download_name("C:\\work\\src\\main.py") == "main.py"
    assert download_name("notes.md") == "notes.md"
    assert download_name("..") == "file.txt"
