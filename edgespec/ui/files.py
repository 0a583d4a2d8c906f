"""A file a person attaches to a chat message, turned into the text the model reads.

What is read: text and code in UTF-8 whatever the extension (Markdown kept as written),
HTML as its visible text, and PDF as the text of each page, marked with its number so a
question about "page 2" can be answered. What cannot be read (a binary file, a scanned PDF
with no text layer, an encrypted or damaged PDF, an empty file) is one ``EdgespecError``
line saying so, which the app shows in place of the attachment.

The message the model is sent puts every file first and the question last
(``message_text``): the app reads the files into the prompt cache while the question is
still being typed, which only helps if the question comes after them.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePosixPath, PureWindowsPath

from pypdf import PdfReader
from pypdf.errors import DependencyError

from edgespec.errors import EdgespecError

KINDS = ("text", "markdown", "html", "pdf")
MARKDOWN_SUFFIXES = {".md", ".markdown"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_MAGIC = b"%PDF-"
SUPPORTED = "attach text, code, Markdown, HTML or PDF"

# pypdf logs a warning for every oddity it reads past ("EOF marker not found"), which would
# land on the app's or the CLI's stderr with nothing a person could do about it: a file it
# cannot read after all is one error line of ours instead.
logging.getLogger("pypdf").setLevel(logging.ERROR)


@dataclass(frozen=True)
class Extracted:
    """What the model reads of one attachment: ``kind`` is one of ``KINDS``; ``pages`` the
    PDF's page count (None for every other kind)."""

    name: str
    kind: str
    text: str
    pages: int | None = None


def read_attachment(name: str, data: bytes) -> Extracted:
    """The text of an attached file, or an ``EdgespecError`` of one line naming why not.

    A PDF is told by its magic bytes, not its name: a PDF saved as ``.txt`` is still one,
    and its bytes would be refused as binary otherwise."""
    shown = file_name(name)
    if not data.strip():
        raise EdgespecError(f"{shown} is empty: nothing to read")
    if data.lstrip()[: len(PDF_MAGIC)] == PDF_MAGIC:
        return _read_pdf(shown, data)
    text = _decode_text(shown, data)
    suffix = PurePosixPath(shown).suffix.lower()
    if suffix in MARKDOWN_SUFFIXES:
        return Extracted(shown, "markdown", text)
    if suffix in HTML_SUFFIXES or (not suffix and _looks_like_html(text)):
        visible = html_text(text)
        if not visible:
            raise EdgespecError(f"{shown} is an HTML page with no visible text: nothing to read")
        return Extracted(shown, "html", visible)
    return Extracted(shown, "text", text)


def file_name(name: str) -> str:
    """The file's own name, without the folders a browser or a temporary path put before it
    (either kind of separator: a name may come from Windows), nor line breaks, which would
    break the ``File: NAME`` line the model reads."""
    base = PureWindowsPath(PurePosixPath(name).name).name
    base = " ".join(base.split())
    return base or "file"


def _decode_text(shown: str, data: bytes) -> str:
    """UTF-8 text with its byte-order mark dropped and every line ending made ``\\n``: the
    model and the diff see one line ending whatever system wrote the file."""
    binary = EdgespecError(f"{shown} is a binary file: {SUPPORTED}")
    # A NUL never occurs in text a person writes; it does in every binary format (and in
    # UTF-16, which is refused with them: the model is given UTF-8 only).
    if b"\x00" in data:
        raise binary
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise binary from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _looks_like_html(text: str) -> bool:
    """A file without an extension whose content opens as an HTML document."""
    head = text.lstrip()[:200].lower()
    return head.startswith("<!doctype html") or head.startswith("<html")


# --- PDF -------------------------------------------------------------------------------


def _read_pdf(shown: str, data: bytes) -> Extracted:
    pages = _pdf_pages(shown, data)
    if not any(page.strip() for page in pages):
        raise EdgespecError(f"{shown} has no text layer (a scanned PDF?): nothing to read")
    parts = []
    for number, page in enumerate(pages, start=1):
        body = page.replace("\r\n", "\n").replace("\r", "\n").strip() or "(no text on this page)"
        parts.append(f"[page {number}]\n{body}")
    return Extracted(shown, "pdf", "\n\n".join(parts), pages=len(pages))


def _pdf_pages(shown: str, data: bytes) -> list[str]:
    """Each page's text, in order. A PDF encrypted with an empty user password (a common
    "no copying" lock) opens as it is; one that needs a password is refused."""
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise EdgespecError(
                f"{shown} is encrypted (password-protected): attach a copy saved without a password"
            )
        return [page.extract_text() or "" for page in reader.pages]
    except EdgespecError:
        raise
    except DependencyError as exc:  # AES encryption needs a package pypdf leaves optional
        raise EdgespecError(f"{shown} is encrypted and cannot be opened here: {_one_line(exc)}") from None
    # A damaged file fails anywhere in pypdf's parser and with any kind of exception (its
    # own, and KeyError, ValueError, … from deep inside): all of them mean "cannot read".
    except Exception as exc:
        raise EdgespecError(f"{shown} is not a readable PDF (damaged?): {_one_line(exc)}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


# --- HTML ------------------------------------------------------------------------------

# Elements whose content is never shown on the page.
HIDDEN = {"script", "style", "noscript", "template"}
# Elements that start a line of their own, and those that start a paragraph.
LINE_BREAKS = {"div", "li", "tr", "dt", "dd", "section", "article", "header", "footer", "nav",
               "main", "aside", "form", "figure", "figcaption", "address", "caption", "title",
               "option", "summary", "details"}  # fmt: skip
PARAGRAPHS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "ul", "ol", "dl",
              "table", "hr"}  # fmt: skip


class _VisibleText(HTMLParser):
    """The text a browser shows, roughly: hidden elements dropped, runs of white space made
    one space (except inside ``<pre>``), a line break per block element, a blank line per
    paragraph, list items as ``- item``, table cells apart."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0  # depth inside hidden elements
        self.pre = 0  # depth inside <pre>
        self.newlines = 2  # newlines at the end of the output: as if after a paragraph
        self.space = False  # white space seen since the last word, not yet written

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in HIDDEN:
            self.hidden += 1
        elif tag == "br":
            self._emit("\n")
        elif tag in ("td", "th"):
            self.space = True
        self._block(tag)
        if tag == "pre":
            self.pre += 1
        elif tag == "li" and not self.hidden:
            self._emit("- ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # <br/> and <hr/>: no content, no end tag to wait for.
        if tag == "br":
            self._emit("\n")
        else:
            self._block(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
        elif tag in ("td", "th"):
            self.space = True
        self._block(tag)

    def handle_data(self, data: str) -> None:
        if self.hidden:
            return
        if self.pre:
            self._emit(data)
            return
        words = " ".join(data.split())
        if not words:
            self.space = self.space or bool(data)
            return
        if data[0].isspace():
            self.space = True
        self._emit(words)
        self.space = data[-1].isspace()

    def _block(self, tag: str) -> None:
        if self.hidden:
            return
        if tag in PARAGRAPHS:
            self._newlines(2)
        elif tag in LINE_BREAKS:
            self._newlines(1)

    def _newlines(self, want: int) -> None:
        self.space = False
        if self.newlines < want:
            self.parts.append("\n" * (want - self.newlines))
            self.newlines = want

    def _emit(self, text: str) -> None:
        if self.hidden or not text:
            return
        # One space between words, none at a line's start or after a "- " already written.
        if self.space and self.newlines == 0 and not self.parts[-1][-1].isspace():
            self.parts.append(" ")
        self.space = False
        self.parts.append(text)
        stripped = text.rstrip("\n")
        self.newlines = len(text) - len(stripped) + (self.newlines if not stripped else 0)

    def text(self) -> str:
        return "".join(self.parts).strip("\n").rstrip()


def html_text(markup: str) -> str:
    """The visible text of an HTML page (see ``_VisibleText``)."""
    parser = _VisibleText()
    parser.feed(markup)
    parser.close()
    return parser.text()


# --- sizes and the message -------------------------------------------------------------


def human_size(n: int) -> str:
    """A byte count as people read it, in decimal units: "512 B", "12 kB", "1.2 MB". One
    decimal below 10 of a unit, none above (a unit that would read 1000 is the next one)."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        shown = f"{value:.1f}" if value < 9.95 else f"{value:.0f}"
        if float(shown) < 1000 or unit == "TB":
            return f"{shown} {unit}"
    raise AssertionError("unreachable")  # the loop returns at its last unit


def fence_for(text: str) -> str:
    """A Markdown code fence longer than any run of backticks in ``text`` (at least three),
    so no line of the file can close it early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def fenced(text: str) -> str:
    """``text`` between fences of its own length, one trailing newline of it dropped (the
    closing fence starts the next line anyway)."""
    fence = fence_for(text)
    body = text[:-1] if text.endswith("\n") else text
    return f"{fence}\n{body}\n{fence}"


def message_text(question: str, files: list[tuple[str, str]]) -> str:
    """What the model is sent for a message with attachments ``files`` (name, text): each
    file first, as ``File: NAME`` and its text fenced, then the question. Files first, so
    the prefix the app reads into the cache before the question is typed is this message's
    own prefix (``attachment_prefix``)."""
    head = "".join(f"File: {file_name(name)}\n{fenced(text)}\n\n" for name, text in files)
    return head + question


def attachment_prefix(files: list[tuple[str, str]]) -> str:
    """The part of ``message_text(question, files)`` that does not depend on the question:
    every message with these files starts with it."""
    return message_text("", files)
