"""Attachments read into text the model can answer from (``edgespec/ui/files.py``): PDFs
page by page (the PDFs written here by hand, byte by byte), text and code of any
extension, HTML as its visible text, and every file that cannot be read refused in one
line."""

from __future__ import annotations

import io

import pytest
from pypdf import PdfWriter

from edgespec.errors import EdgespecError
from edgespec.ui.files import (
    attachment_prefix,
    fence_for,
    human_size,
    message_text,
    read_attachment,
)


def pdf_bytes(pages: list[list[str] | None]) -> bytes:
    """A valid PDF: one page per item, each line of text on it drawn in Helvetica, a page
    given as None has no content stream at all (what a scan's page is to a text reader).
    The cross-reference table holds every object's real byte offset."""
    objects: dict[int, bytes] = {}
    page_numbers = []
    number = 4  # 1: catalog, 2: page tree, 3: font
    for lines in pages:
        page_numbers.append(number)
        resources = b"/Resources << /Font << /F1 3 0 R >> >>"
        page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] " + resources
        if lines is None:
            objects[number] = page + b" >>"
            number += 1
            continue
        drawn = b" 0 -16 Td ".join(b"(" + line.encode("latin-1") + b") Tj" for line in lines)
        stream = b"BT /F1 12 Tf 72 720 Td " + drawn + b" ET"
        objects[number] = page + b" /Contents %d 0 R >>" % (number + 1)
        objects[number + 1] = b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream"
        number += 2
    kids = b" ".join(b"%d 0 R" % n for n in page_numbers)
    objects[1] = b"<< /Type /Catalog /Pages 2 0 R >>"
    objects[2] = b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % len(page_numbers)
    objects[3] = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for n in sorted(objects):
        offsets[n] = len(out)
        out += b"%d 0 obj\n" % n + objects[n] + b"\nendobj\n"
    xref = len(out)
    size = max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, size))
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


def refusal(name: str, data: bytes) -> str:
    with pytest.raises(EdgespecError) as caught:
        read_attachment(name, data)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(name), message
    return message


def test_a_pdf_is_read_page_by_page_each_page_marked():
    data = pdf_bytes([["Apples grow on trees.", "They are red."], ["Bananas are yellow."]])
    read = read_attachment("fruit.pdf", data)
    assert (read.name, read.kind, read.pages) == ("fruit.pdf", "pdf", 2)
    assert read.text.startswith("[page 1]\n")
    first, second = read.text.split("[page 2]\n")
    assert "Apples grow on trees." in first and "They are red." in first
    assert "Bananas" not in first
    assert second.strip() == "Bananas are yellow."
    # The magic bytes, not the name, say what a file is.
    assert read_attachment("fruit.txt", data).text == read.text


def test_a_pdf_page_without_text_is_marked_and_a_pdf_without_any_is_refused():
    mixed = read_attachment("mixed.pdf", pdf_bytes([["Only words here."], None]))
    assert mixed.pages == 2 and "[page 2]\n(no text on this page)" in mixed.text
    message = refusal("scan.pdf", pdf_bytes([None, None]))
    assert message == "scan.pdf has no text layer (a scanned PDF?): nothing to read"


def test_an_encrypted_or_damaged_pdf_is_one_line():
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    locked = io.BytesIO()
    writer.write(locked)
    assert "encrypted (password-protected)" in refusal("locked.pdf", locked.getvalue())
    whole = pdf_bytes([["Some text."]])
    assert "not a readable PDF" in refusal("cut.pdf", whole[: len(whole) // 3])


def test_binary_files_are_refused_in_one_line():
    expected = "x.bin is a binary file: attach text, code, Markdown, HTML or PDF"
    assert refusal("x.bin", b"\x7fELF\x02\x01\x01\x00\x00\x00") == expected
    # No NUL, but not UTF-8 either (Latin-1 bytes): refused alike.
    assert refusal("x.bin", b"caf\xe9 cr\xe8me") == expected


def test_empty_files_are_refused():
    assert refusal("empty.txt", b"") == "empty.txt is empty: nothing to read"
    assert "empty" in refusal("blank.py", b"  \n\r\n\t")


def test_utf8_code_of_any_extension_is_text_with_one_line_ending():
    source = "\ufeffconst greet = () => {\r\n  return 'héllo ✓';\r\n};\r\n"
    read = read_attachment("widget.zig.tmpl", source.encode("utf-8"))
    assert (read.kind, read.pages) == ("text", None)
    assert read.text == "const greet = () => {\n  return 'héllo ✓';\n};\n"
    # A name with folders (a temporary path, a Windows path) is shown as the file's own.
    assert read_attachment("C:\\Users\\ada\\Makefile", b"all:\n\ttrue\n").name == "Makefile"
    assert read_attachment("/tmp/gradio/abc/notes", b"plain words").text == "plain words"


def test_markdown_is_kept_as_written():
    text = "# Title\n\nSome *emphasis* and <b>inline HTML</b>.\n\n```py\nx = 1\n```\n"
    read = read_attachment("README.markdown", text.encode())
    assert (read.kind, read.text) == ("markdown", text)


PAGE = """<!DOCTYPE html>
<html><head><title>Report</title><style>body { color: red }</style>
<script>var secret = "never shown";</script></head>
<body><h1>Results  &amp; notes</h1><p>First
   paragraph, <b>bold</b> word.</p><div>A line</div><div>Another line<br>after a break</div>
<ul><li>one</li><li> two </li></ul>
<pre>  indented
    code</pre>
<table><tr><td>a</td><td>b</td></tr></table>
</body></html>"""

VISIBLE = """Report

Results & notes

First paragraph, bold word.

A line
Another line
after a break

- one
- two

  indented
    code

a b"""


def test_html_is_read_as_its_visible_text():
    read = read_attachment("page.html", PAGE.encode())
    assert (read.kind, read.text) == ("html", VISIBLE)
    # Sniffed from its content when the name has no extension; not when it names another kind.
    assert read_attachment("download", PAGE.encode()).kind == "html"
    assert read_attachment("page.txt", PAGE.encode()).text == PAGE
    assert "no visible text" in refusal("blank.htm", b"<html><script>x()</script></html>")


def test_human_sizes():
    cases = {0: "0 B", 999: "999 B", 1000: "1.0 kB", 1234: "1.2 kB", 9_960: "10 kB", 12_345: "12 kB",
             999_999: "1.0 MB", 1_200_000: "1.2 MB", 3_400_000_000: "3.4 GB"}  # fmt: skip
    assert {n: human_size(n) for n in cases} == cases


def test_message_text_puts_files_first_fenced_beyond_their_own_backticks():
    files = [("a.py", "print('hi')\n"), ("notes.md", "Use ```py\nx\n``` and ````\n")]
    text = message_text("What does a.py print?", files)
    assert fence_for(files[1][1]) == "`````"
    assert text == (
        "File: a.py\n```\nprint('hi')\n```\n\n"
        "File: notes.md\n`````\nUse ```py\nx\n``` and ````\n`````\n\n"
        "What does a.py print?"
    )
    assert message_text("Just a question", []) == "Just a question"


def test_every_message_starts_with_its_attachments_prefix():
    files = [("report.pdf", "[page 1]\nText"), ("C:\\x\\y.txt", "line\n``\n")]
    prefix = attachment_prefix(files)
    assert prefix.startswith("File: report.pdf\n") and "File: y.txt\n" in prefix
    for question in ("", "Summarise page 1.", "```\nfenced?\n```", "\n\nleading blank lines", "é ✓"):
        message = message_text(question, files)
        assert message.startswith(prefix) and message[len(prefix) :] == question
