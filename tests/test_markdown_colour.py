"""An answer's Markdown rendered with its provenance over the rendered text (pure): the
structure is the Markdown's, and each coloured character is the source character it shows,
with that character's provenance."""

from __future__ import annotations

from html.parser import HTMLParser

from edgespec.decoding.events import BONUS, DRAFT, PLAIN, TARGET
from edgespec.ui.markdown_colour import Answer, coloured_markdown, render_blocks
from edgespec.ui.text import PROVENANCE_LABELS, coloured_answer

VOID = {"br", "hr", "img"}


class Drawn(HTMLParser):
    """What markup draws: each provenance span as [source, text, the tags around it], and
    the text of each code block."""

    def __init__(self, markup: str):
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, int | None]] = []  # (tag, index of its span in spans)
        self.spans: list[list] = []
        self.code: list[str] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        span = None
        if tag == "span" and "prov" in classes:
            source = next(name[5:] for name in classes if name.startswith("prov-"))
            around = tuple(name for name, _ in self.open if name != "span")
            span = len(self.spans)
            self.spans.append([source, "", around])
        if tag == "code" and self.open and self.open[-1][0] == "pre":
            self.code.append("")
        self.open.append((tag, span))

    def handle_endtag(self, tag):
        assert self.open and self.open[-1][0] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        spans = [span for _, span in self.open if span is not None]
        if spans:
            self.spans[spans[-1]][1] += data
        if any(tag == "code" for tag, _ in self.open) and any(tag == "pre" for tag, _ in self.open):
            self.code[-1] += data

    def runs(self) -> list[tuple[str, str]]:
        """The coloured text as runs of one provenance, spans of one source joined."""
        runs: list[tuple[str, str]] = []
        for source, text, _ in self.spans:
            if runs and runs[-1][0] == source:
                runs[-1] = (source, runs[-1][1] + text)
            else:
                runs.append((source, text))
        return runs


def drawn(pieces: list[list[str]]) -> Drawn:
    return Drawn(coloured_markdown(pieces, PROVENANCE_LABELS))


def test_bold_across_two_runs_is_bold_and_each_part_keeps_its_colour():
    markup = coloured_markdown([["Hello **wor", DRAFT], ["ld**", TARGET]], PROVENANCE_LABELS)
    assert "<strong>" in markup and "*" not in markup
    assert Drawn(markup).spans == [
        [DRAFT, "Hello ", ("p",)],
        [DRAFT, "wor", ("p", "strong")],
        [TARGET, "ld", ("p", "strong")],
    ]


def test_a_list_is_a_list_and_its_items_keep_their_colours():
    pieces = [["Steps:\n\n- one\n- tw", DRAFT], ["o **thr", TARGET], ["ee**\n- fo", BONUS], ["ur\n", PLAIN]]
    page = drawn(pieces)
    assert page.spans == [
        [DRAFT, "Steps:", ("p",)],
        [DRAFT, "one", ("ul", "li")],
        [DRAFT, "tw", ("ul", "li")],
        [TARGET, "o ", ("ul", "li")],
        [TARGET, "thr", ("ul", "li", "strong")],
        [BONUS, "ee", ("ul", "li", "strong")],
        [BONUS, "fo", ("ul", "li")],
        [PLAIN, "ur", ("ul", "li")],
    ]


def test_a_table_is_a_table_and_its_cells_keep_their_colours():
    # The second header cell repeats the first one's text, and a cell's "-" is also in the
    # delimiter row: each cell must find its own characters.
    pieces = [
        ["| n | n |\n", DRAFT],
        ["|---|--:|\n", TARGET],
        ["| -1 | **2", BONUS],
        ["2** |\n| 3 | 4 |\n", PLAIN],
    ]
    page = drawn(pieces)
    assert [(source, text, around[-1]) for source, text, around in page.spans] == [
        (DRAFT, "n", "th"),
        (DRAFT, "n", "th"),
        (BONUS, "-1", "td"),
        (BONUS, "2", "strong"),
        (PLAIN, "2", "strong"),
        (PLAIN, "3", "td"),
        (PLAIN, "4", "td"),
    ]
    assert all(around[0] == "table" for _, _, around in page.spans)


def test_a_code_block_keeps_its_exact_text_its_copy_button_and_its_colours():
    # The code starts with the letter its language does: matching must start at the code.
    code = "print(x)\n\n    return {'<b>': 1}\n"
    pieces = [["Like this:\n\n```python\n", PLAIN], ["print", DRAFT], [code[5:] + "```\nDone.", TARGET]]
    markup = coloured_markdown(pieces, PROVENANCE_LABELS)
    page = Drawn(markup)
    assert page.code == [code], "the copy button copies the code, nothing else"
    assert '<div class="code_wrap"><button class="copy_code_button"' in markup
    # No language class: the chat's Prism would highlight the block again, spans lost.
    assert "<pre><code><span" in markup and "language-" not in markup
    assert page.runs() == [(PLAIN, "Like this:"), (DRAFT, "print"), (TARGET, code[5:] + "Done.")]
    assert all(around[-2:] == ("pre", "code") for _, text, around in page.spans if text in code)
    # Syntax colours are Prism's classes, as the chat's own code blocks have.
    assert '<span class="token keyword">return</span>' in markup


def test_a_code_block_without_a_known_language_is_its_text():
    page = drawn([["```\n", PLAIN], ["a  <b>\n\n\tc\n", DRAFT], ["```", PLAIN]])
    assert page.code == ["a  <b>\n\n\tc\n"]
    assert page.runs() == [(DRAFT, "a  <b>\n\n\tc\n")]


def test_text_is_escaped_and_an_unknown_provenance_is_drawn_plain():
    pieces = [["Say <script>alert(1)</script> & ", DRAFT], ["bye", '"><img src=x>']]
    markup = coloured_markdown(pieces, PROVENANCE_LABELS)
    assert "<script" not in markup and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; " in markup
    assert "<img" not in markup and 'class="prov prov-plain"' in markup
    assert drawn(pieces).runs() == [(DRAFT, "Say <script>alert(1)</script> & "), (PLAIN, "bye")]


def test_a_character_the_renderer_makes_up_costs_no_more_than_itself():
    # An entity is drawn as a character of its own; a code span's newline as a space.
    pieces = [["&copy; 2024 `a\nb` c", DRAFT], [" d\n\nnext", TARGET]]
    assert drawn(pieces).spans == [
        [DRAFT, "© 2024 ", ("p",)],
        [DRAFT, "a b", ("p", "code")],
        [DRAFT, " c", ("p",)],
        [TARGET, " d", ("p",)],
        [TARGET, "next", ("p",)],
    ]


def test_every_coloured_character_is_a_source_character_of_its_colour_in_order():
    pieces = [
        ["# Ti", DRAFT],
        ["tle\n\nSome *emph* and [a link](https://example.com/a) then", TARGET],
        [" `code`.\n\n> quoted\n> line\n\n1. first\n2. sec", BONUS],
        ["ond\n\n---\n\nEnd ~~old~~ new.", PLAIN],
    ]
    source = "".join(text for text, _ in pieces)
    owners = [owner for text, owner in pieces for _ in text]
    at = 0
    for owner, text, _ in drawn(pieces).spans:
        for char in text:
            while source[at] != char and not (char.isspace() and source[at].isspace()):
                at += 1
            assert owners[at] == owner, (char, at, owner)
            at += 1
    page = coloured_markdown(pieces, PROVENANCE_LABELS)
    for tag in ("<h1>", "<em>", '<a href="https://example.com/a"', "<blockquote>", "<ol>", "<hr>", "<s>"):
        assert tag in page


def test_the_chat_bubble_is_one_line_with_the_source_kept_for_copying():
    bubble = coloured_answer([["para one\n\n```\nx\n\ny\n```\n", DRAFT], ["- <b>", TARGET]])
    assert "\n" not in bubble, "a blank line would end the chat's HTML block"
    assert bubble.startswith('<div class="prov-answer"><p>')
    source = "para one&#10;&#10;```&#10;x&#10;&#10;y&#10;```&#10;- &lt;b&gt;"
    assert bubble.endswith(f'<div class="prov-source" hidden>{source}</div></div>')
    assert Drawn(bubble).code == ["x\n\ny\n"]


def blocks_streamed(text: str, owner: str = DRAFT, step: int = 3) -> tuple[list[str], list[str]]:
    """``text`` streamed ``step`` characters at a time: the closed blocks as sent, and
    each open block as drawn."""
    closed, shown, open_at = [], [], 0
    for end in range(step, len(text) + step, step):
        blocks = render_blocks(Answer.of([[text[:end], owner]]), open_at, False, PROVENANCE_LABELS)
        closed += blocks.closed
        shown.append(blocks.open)
        open_at = blocks.open_at
    last = render_blocks(Answer.of([[text, owner]]), open_at, True, PROVENANCE_LABELS)
    return closed + last.closed, shown


def test_a_streamed_answer_is_sent_block_by_block_as_it_is_drawn_whole():
    text = (
        "Intro with **bold** text.\n\n- a list\n- of `items`\n\n| h | i |\n|---|---|\n| 1 | 2 |\n\n"
        "```python\ndef f():\n\n    return 1\n```\n\nLast *words*."
    )
    closed, _ = blocks_streamed(text)
    assert "".join(closed) == coloured_markdown([[text, DRAFT]], PROVENANCE_LABELS)
    assert len(closed) == 5, "each closed block sent once"


def test_an_open_block_is_drawn_with_its_inline_markup_closed_and_no_stray_marker():
    def open_block(text: str) -> str:
        return render_blocks(Answer.of([[text, DRAFT]]), 0, False, PROVENANCE_LABELS).open

    assert Drawn(open_block("Hello **wor")).spans == [
        [DRAFT, "Hello ", ("p",)],
        [DRAFT, "wor", ("p", "strong")],
    ]
    assert Drawn(open_block("call `is_pr")).spans[-1] == [DRAFT, "is_pr", ("p", "code")]
    assert Drawn(open_block("Hello **")).runs() == [(DRAFT, "Hello")]
    assert Drawn(open_block("2 * 3 = 6")).runs() == [(DRAFT, "2 * 3 = 6")], "no emphasis to close"
    assert Drawn(open_block("- item *it")).spans[-1] == [DRAFT, "it", ("ul", "li", "em")]
    # An open fence is a code block to the end of the text so far.
    fenced = open_block("```python\ndef f(")
    assert Drawn(fenced).code == ["def f("] and "copy_code_button" in fenced


def test_a_streamed_answer_only_ever_grows_as_drawn():
    text = (
        "Use `is_prime` as **the** check:\n\n| n | prime |\n|---|---|\n| 2 | yes |\n\n"
        "```python\ndef is_prime(n):\n    return n > 1\n```\nDone, *really*."
    )
    closed, open_at, shown = "", 0, []
    for end in range(1, len(text) + 1):
        blocks = render_blocks(Answer.of([[text[:end], DRAFT]]), open_at, False, PROVENANCE_LABELS)
        closed += "".join(blocks.closed)
        open_at = blocks.open_at
        shown.append(Drawn(closed + blocks.open).runs()[0][1])
    lengths = [len(drawn_text) for drawn_text in shown]
    assert lengths == sorted(lengths), "no marker or table row shown, then taken back"
    assert (
        shown[-1] == "Use is_prime as the check:nprime2yesdef is_prime(n):\n    return n > 1\nDone, really."
    )
