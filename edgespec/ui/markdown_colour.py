"""An answer's Markdown rendered to HTML with its provenance laid over the rendered text.

The answer is rendered as the chat renders Markdown (paragraphs, lists, tables, fenced
code with a copy button and syntax colours), then every character of the rendered text is
matched to the source character it shows: in order, each to the next equal character of
the source, so the characters of the Markdown syntax (``**``, ``- ``, fences) are skipped.
Runs of characters from one provenance become ``<span class="prov prov-SOURCE">``.

Matching restarts at each block: every paragraph, heading, table cell and code block is
told where its text begins in the source, so a character the renderer made up (``&copy;``
becomes ``©``) costs the colour of a character or two, never the rest of the answer.

Safe to put in a page as it is: the source's text is always escaped (raw HTML in an
answer is shown as text), the tags are the renderer's own, and a class names one of a
fixed set of provenances.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser

from markdown_it import MarkdownIt
from markdown_it.token import Token

from edgespec.decoding.events import BONUS, DRAFT, PLAIN, TARGET

try:  # Pygments comes with Gradio (through rich); without it code is not syntax-coloured
    from pygments import token as _kinds
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound
except ImportError:  # pragma: no cover
    _kinds = None

SOURCES = (DRAFT, TARGET, BONUS, PLAIN)
# As the chat draws a plain answer: GFM tables and strikethrough, a line break at every
# newline (the Chatbot's line_breaks). Raw HTML stays text: it is the model's output.
_MARKDOWN = MarkdownIt("commonmark", {"breaks": True, "html": False}).enable(["table", "strikethrough"])
_ANCHOR = "data-at"  # where an element's text begins in the source; never sent to the page
_BLOCK_TAGS = frozenset(
    {"p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote", "pre"}
    | {"table", "thead", "tbody", "tr", "th", "td", "hr", "div"}
)
_VOID_TAGS = frozenset({"br", "hr", "img"})
_SPACE = re.compile(r"[ \t\n]")
_NEWLINE = re.compile("\n")
# Gradio's own names: its chat copies a code block when a button of this class is
# clicked (the text of the button's parent, less the button's), and styles both.
_COPY_BUTTON = (
    '<button class="copy_code_button" title="copy code"><span class="copy-text">'
    '<svg viewBox="0 0 16 16" width="15" height="15" fill="none" stroke="currentColor" '
    'stroke-width="1.3"><rect x="5.5" y="5.5" width="8" height="8" rx="1.5"/>'
    '<rect x="2.5" y="2.5" width="8" height="8" rx="1.5"/></svg></span><span class="check">'
    '<svg viewBox="0 0 16 16" width="15" height="15" fill="none" stroke="currentColor" '
    'stroke-width="1.5"><polyline points="3,8.5 6.5,12 13,4.5"/></svg></span></button>'
)
_TRAILING_MARKERS = "*_`~"
_FENCE_START = re.compile(r"\s*(?:(?:[-*+]|\d+[.)]|>)\s*)*(?:```|~~~)")


@dataclass(frozen=True)
class Answer:
    """An answer's text, as the renderer reads it, and each character's provenance."""

    text: str
    owners: list[str]

    @classmethod
    def of(cls, pieces: Sequence[Sequence[str]]) -> Answer:
        """From [text, source] runs. Newlines normalised as the renderer does, so its line
        numbers count the lines of this text."""
        text = "".join(piece[0] for piece in pieces)
        owners: list[str] = []
        for piece_text, source in pieces:
            owners.extend([source if source in SOURCES else PLAIN] * len(piece_text))
        if "\r" in text or "\0" in text:
            text, owners = _normalised(text, owners)
        return cls(text, owners)

    def part(self, start: int) -> Answer:
        return Answer(self.text[start:], self.owners[start:])


def _normalised(text: str, owners: list[str]) -> tuple[str, list[str]]:
    chars, kept = [], []
    for index, char in enumerate(text):
        if char == "\r" and text[index + 1 : index + 2] == "\n":
            continue
        chars.append("\n" if char == "\r" else "\ufffd" if char == "\0" else char)
        kept.append(owners[index])
    return "".join(chars), kept


@dataclass(frozen=True)
class Blocks:
    """An answer's top-level blocks as markup: ``closed`` ones no later text can change
    (Markdown closes a block for good once the next one starts), then the ``open`` last
    one, which starts at ``open_at`` in the answer's text."""

    closed: list[str]
    open: str
    open_at: int


def coloured_markdown(pieces: Sequence[Sequence[str]], labels: Mapping[str, str]) -> str:
    """A finished answer's Markdown as HTML, its text in provenance spans. ``labels``: a
    span's tooltip by provenance."""
    blocks = render_blocks(Answer.of(pieces), 0, True, labels)
    return "".join(blocks.closed)


def render_blocks(answer: Answer, start: int, finished: bool, labels: Mapping[str, str]) -> Blocks:
    """The blocks of ``answer`` from ``start`` (the start of a block: the ``open_at`` of an
    earlier call), so a streamed answer is rendered from its open block on, not whole. A
    finished answer's last block is closed; an unfinished one is drawn as if its open
    inline markup were closed (``_drafts``)."""
    part = answer.part(start)
    tokens = _MARKDOWN.parse(part.text)
    groups = _top_level(tokens)
    if not finished and groups:
        *groups, last = groups
        open_at = _line_starts(part.text)[tokens[last[0]].map[0]] if tokens[last[0]].map else 0
    else:
        last, open_at = None, len(part.text)
    _anchored(tokens, part.text)
    colourer = _Colourer(part, labels)
    closed = [colourer.render(tokens[first:end]) for first, end in groups]
    open_markup = _open_block(part.part(open_at), labels, tokens[last[0] : last[1]]) if last else ""
    return Blocks(closed, open_markup, start + open_at)


def _open_block(tail: Answer, labels: Mapping[str, str], tokens: list[Token]) -> str:
    """The last block of an unfinished answer: with its open code span or emphasis closed
    and a marker it ends on hidden (they would show as text, then vanish), where that
    draws no character the answer does not have."""
    plain = _Colourer(tail, labels)
    _anchored(tokens, tail.text, shift=_line_starts_offset(tokens))
    markup = plain.render(tokens)
    for draft in _drafts(tail.text, tokens[0].type if tokens else ""):
        colourer = _Colourer(tail, labels)
        drafted = _MARKDOWN.parse(draft)
        _anchored(drafted, draft)
        candidate = colourer.render(drafted)
        if colourer.unmatched <= plain.unmatched:
            return candidate
    return markup


def _line_starts_offset(tokens: list[Token]) -> int:
    """How many lines precede the open block in the text it was parsed with."""
    return tokens[0].map[0] if tokens and tokens[0].map else 0


def _drafts(text: str, kind: str) -> list[str]:
    """What to try drawing of an unfinished block (``kind``: its first token's type),
    best first: its open code span and emphasis closed, then only the markers it ends on
    dropped. In a paragraph, the rows a table starts with are dropped too: they are a
    paragraph until the table's delimiter row is whole."""
    base = _without_table_rows(text) if kind == "paragraph_open" else text
    trimmed = base.rstrip(_TRAILING_MARKERS)
    line = trimmed[trimmed.rfind("\n") + 1 :]
    drafts = []
    # Not in code, nor on a fence's first line: "```py" is a fence opening, not a code span.
    closers = "" if kind in ("fence", "code_block") or _FENCE_START.match(line) else _closers(line)
    if closers:
        drafts.append(trimmed + closers)
    if trimmed != text:
        drafts.append(trimmed)
    return drafts


def _without_table_rows(text: str) -> str:
    lines = text.split("\n")
    if lines and not lines[-1].strip():
        lines.pop()
    while lines and lines[-1].lstrip().startswith("|"):
        lines.pop()
    return "\n".join(lines)


def _closers(line: str) -> str:
    """What closes the code span and emphasis left open in ``line``, innermost first."""
    stack: list[str] = []
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\" and not (stack and stack[-1][0] == "`"):
            index += 2
            continue
        if char not in "`*":
            index += 1
            continue
        end = index
        while end < len(line) and line[end] == char:
            end += 1
        run = line[index:end]
        in_code = bool(stack) and stack[-1][0] == "`"
        if char == "`" and in_code and stack[-1] == run:
            stack.pop()
        elif char == "`" and not in_code:
            stack.append(run)
        elif char == "*" and not in_code and len(run) <= 2:
            before = line[index - 1] if index else " "
            after = line[end] if end < len(line) else " "
            if stack and stack[-1] == run and not before.isspace():
                stack.pop()
            elif not after.isspace():
                stack.append(run)
        index = end
    return "".join(reversed(stack))


def _top_level(tokens: list[Token]) -> list[tuple[int, int]]:
    """The token ranges of the top-level blocks, in order."""
    groups, first = [], None
    for index, token in enumerate(tokens):
        if token.level != 0:
            continue
        if token.nesting >= 0 and first is None:
            first = index
        if token.nesting <= 0 and first is not None:
            groups.append((first, index + 1))
            first = None
    return groups


def _line_starts(text: str) -> list[int]:
    return [0, *(match.end() for match in _NEWLINE.finditer(text))]


def _anchored(tokens: list[Token], text: str, shift: int = 0) -> None:
    """Marks the element that holds each block's text with where that text begins and
    ends in ``text`` (``shift``: how many lines of the parsed text precede ``text``)."""
    starts = _line_starts(text)
    for token in tokens:
        if token.attrs:
            token.attrs.pop(_ANCHOR, None)  # from a parse of a longer text

    def at(line: int) -> int:
        line -= shift
        return starts[line] if 0 <= line < len(starts) else len(text)

    cursor = 0
    for index, token in enumerate(tokens):
        if not token.map:
            continue
        if token.type in ("fence", "code_block"):
            first = token.map[0] + (token.type == "fence")  # a fence's text starts a line down
            token.attrSet(_ANCHOR, f"{at(first)}:{at(token.map[1])}")
        elif token.type == "inline":
            end = at(token.map[1])
            head = token.content.split("\n", 1)[0]
            found = text.find(head, max(at(token.map[0]), cursor), end) if head else -1
            holder = _holder(tokens, index)
            if found < 0 or holder is None:
                continue  # matching goes on from where the last block left off
            cursor = found + len(head)
            holder.attrSet(_ANCHOR, f"{found}:{end}")


def _holder(tokens: list[Token], index: int) -> Token | None:
    """The drawn element an inline's text goes into: its paragraph, heading or cell, or a
    tight list's item (whose paragraphs are not drawn)."""
    for before in range(index - 1, -1, -1):
        token = tokens[before]
        if not token.hidden:
            return token if token.nesting == 1 else None
    return None


class _Colourer(HTMLParser):
    """Rewrites the renderer's HTML: text in provenance spans, code blocks with a copy
    button and syntax colours, the whitespace between blocks dropped (the page may show it
    in a pre-wrap slot) and the anchors taken out."""

    def __init__(self, answer: Answer, labels: Mapping[str, str]):
        super().__init__(convert_charrefs=True)
        self.answer = answer
        self._titles = {source: html.escape(labels.get(source, source)) for source in SOURCES}
        self.position = 0  # the next source character a rendered one may match
        self.unmatched = 0  # rendered characters with no source character of their own
        self._out: list[str] = []
        self._limits: list[tuple[int, int]] = []  # (depth, end of the element's text)
        self._depth = 0
        self._after_block = True
        self._code: list[str] | None = None  # a code block's text, gathered whole
        self._language = ""

    def render(self, tokens: list[Token]) -> str:
        self._out = []
        self.feed(_MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {}))
        self.close()
        return "".join(self._out)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        kept = [(name, value) for name, value in attrs if name != _ANCHOR]
        anchor = dict(attrs).get(_ANCHOR)
        if anchor:
            begin, end = (int(part) for part in anchor.split(":"))
            self.position = max(self.position, begin)
            self._limits.append((self._depth, max(end, self.position)))
        if tag == "pre":
            self._out.append('<div class="code_wrap">' + _COPY_BUTTON)
        if tag == "code" and self._out and self._out[-1].startswith("<pre"):
            self._code, self._language = [], _language(kept)
            # No language class: the chat's Prism would highlight the block again from
            # its text, and so drop the provenance spans in it.
            kept = [(name, value) for name, value in kept if name != "class"]
        if tag == "a":
            # As the chat does for its own links: a new tab, and no window.opener.
            kept += [("target", "_blank"), ("rel", "noopener noreferrer")]
        self._out.append(f"<{tag}{_attributes(kept)}>")
        if tag not in _VOID_TAGS:
            self._depth += 1
        self._after_block = tag in _BLOCK_TAGS

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._out.append(f"<{tag}{_attributes([(n, v) for n, v in attrs if n != _ANCHOR])}>")
        self._after_block = tag in _BLOCK_TAGS

    def handle_endtag(self, tag: str) -> None:
        if tag == "code" and self._code is not None:
            self._out.append(self._code_markup("".join(self._code)))
            self._code = None
        self._out.append(f"</{tag}>" + ("</div>" if tag == "pre" else ""))
        self._depth -= 1
        while self._limits and self._limits[-1][0] >= self._depth:
            self._limits.pop()
        self._after_block = tag in _BLOCK_TAGS

    def handle_data(self, data: str) -> None:
        if self._code is not None:
            self._code.append(data)
            return
        if self._after_block and not data.strip():
            return  # the renderer's newline between two blocks
        self._after_block = False
        self._out.append(self._spans(data, self._align(data)))

    def _align(self, text: str) -> list[str]:
        """The provenance of each character of ``text``: that of the source character it
        shows, the next one equal to it (any whitespace for whitespace: a code span shows
        a newline as a space)."""
        source, owners = self.answer.text, self.answer.owners
        if not owners:
            return [PLAIN] * len(text)
        limit = min(self._limits[-1][1], len(source)) if self._limits else len(source)
        start = self.position
        if source.startswith(text, start) and start + len(text) <= limit:
            self.position += len(text)
            return owners[start : start + len(text)]
        found: list[str] = []
        for char in text:
            at = self._find(char, limit)
            if at < 0:
                self.unmatched += 1
                found.append(owners[min(self.position, len(owners) - 1)])
                continue
            found.append(owners[at])
            self.position = at + 1
        return found

    def _find(self, char: str, limit: int) -> int:
        source, position = self.answer.text, self.position
        if position < limit and source[position] == char:
            return position
        if char in " \t\n":
            match = _SPACE.search(source, position, limit)
            return match.start() if match else -1
        return source.find(char, position, limit)

    def _spans(self, text: str, owners: Sequence[str]) -> str:
        """``text`` in one span per run of one provenance."""
        return "".join(
            self._span(owners[begin], html.escape(text[begin:end], quote=False))
            for begin, end in _runs(owners)
        )

    def _span(self, source: str, markup: str) -> str:
        return f'<span class="prov prov-{source}" title="{self._titles[source]}">{markup}</span>'

    def _code_markup(self, code: str) -> str:
        """A code block's text, kept exactly (its copy button copies it): a span per run
        of one provenance, and in it the syntax colours of the chat's own code blocks
        (Prism's class names), cut where a run ends."""
        owners = self._align(code)
        pieces = iter(_highlighted(code, self._language))
        piece = next(pieces, None)
        parts = []
        for begin, end in _runs(owners):
            inner = []
            while piece is not None and piece[0] < end:
                text = html.escape(code[max(piece[0], begin) : min(piece[1], end)], quote=False)
                inner.append(f'<span class="token {piece[2]}">{text}</span>' if piece[2] else text)
                if piece[1] > end:
                    break  # it goes on in the next run
                piece = next(pieces, None)
            parts.append(self._span(owners[begin], "".join(inner)))
        return "".join(parts)


def _runs(owners: Sequence[str]) -> list[tuple[int, int]]:
    """The (start, end) of each run of one provenance in ``owners``."""
    runs, start = [], 0
    for index in range(1, len(owners) + 1):
        if index == len(owners) or owners[index] != owners[start]:
            runs.append((start, index))
            start = index
    return runs


def _attributes(attrs: list[tuple[str, str | None]]) -> str:
    return "".join(
        f" {name}" if value is None else f' {name}="{html.escape(value)}"' for name, value in attrs
    )


def _language(attrs: list[tuple[str, str | None]]) -> str:
    classes = (dict(attrs).get("class") or "").split()
    return next((name[len("language-") :] for name in classes if name.startswith("language-")), "")


def _highlighted(code: str, language: str) -> list[tuple[int, int, str]]:
    """``code`` cut into (start, end, Prism class or "") pieces; one uncoloured piece when
    the language is unknown or none."""
    lexer = _lexer(language) if language else None
    whole = [(0, len(code), "")]
    if lexer is None or not code:
        return whole
    pieces: list[tuple[int, int, str]] = []
    for start, kind, value in lexer.get_tokens_unprocessed(code):
        if code[start : start + len(value)] != value:
            return whole  # a lexer that rewrites its input: colour nothing rather than misplace
        name = _prism_class(kind)
        if pieces and pieces[-1][2] == name and pieces[-1][1] == start:
            pieces[-1] = (pieces[-1][0], start + len(value), name)
        elif value:
            pieces.append((start, start + len(value), name))
    covered = sum(end - start for start, end, _ in pieces)
    return pieces if covered == len(code) else whole


@functools.lru_cache(maxsize=64)
def _lexer(language: str):
    """Pygments' lexer for a fence's language, or None."""
    if _kinds is None:
        return None
    try:
        return get_lexer_by_name(language, stripnl=False, stripall=False, ensurenl=False)
    except ClassNotFound:
        return None


@functools.lru_cache(maxsize=1)
def _prism_names() -> dict:
    return {
        _kinds.Comment: "comment",
        _kinds.String: "string",
        _kinds.Number: "number",
        _kinds.Keyword.Constant: "boolean",
        _kinds.Keyword: "keyword",
        _kinds.Operator.Word: "keyword",
        _kinds.Operator: "operator",
        _kinds.Punctuation: "punctuation",
        _kinds.Name.Builtin: "builtin",
        _kinds.Name.Function: "function",
        _kinds.Name.Decorator: "function",
        _kinds.Name.Class: "class-name",
        _kinds.Name.Tag: "tag",
        _kinds.Name.Attribute: "attr-name",
        _kinds.Name.Variable: "variable",
        _kinds.Name.Constant: "constant",
    }


def _prism_class(kind) -> str:
    """The Prism class the chat's stylesheet colours for a Pygments token type."""
    names = _prism_names()
    while kind is not None:
        if kind in names:
            return names[kind]
        kind = kind.parent
    return ""
