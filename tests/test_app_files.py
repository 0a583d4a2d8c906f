"""A person's own files and chats' places, tried as a person would, in real headless
Chromium against ``app.py`` in its own process: a code file attached by the file input and
by a drop on the message box, asked about, edited in the edit pane (diff, download under
its name, accept, edit again); the pane's revision is the one ``edgespec generate
--prediction`` gives; a chat branched and answered in the branch; folders; and a file too
big for the context refused with nothing lost.

No step waits for a speed: each waits for an answer's or a revision's end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.ui.canvas_text import edit_prompt, line_diff, revision_from_answer
from tests.app_process import AppProcess
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS, OUTPUT_DIR, unfold
from tests.test_app_keeps import BUBBLES_JS, ask, listed, open_page, wait_idle

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_models,
    pytest.mark.filterwarnings("ignore:'future.no_silent_downcasting' is deprecated"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

REPO = Path(__file__).resolve().parent.parent
CODE = '''def add(a, b):
    """The sum of a and b."""
    return a + b


def twice(x):
    return add(x, x)


if __name__ == "__main__":
    print(twice(21))
'''
INSTRUCTION = "Rename the function add to plus everywhere in the file."
CHANGED_JS = "() => document.querySelector('#canvas-changed')?.innerText || ''"
CHIPS_JS = "() => document.querySelector('#attach-chips')?.innerText || ''"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[AppProcess]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (make test installs it)")
    process = AppProcess(tmp_path / "data", tmp_path / "cache").start()
    yield process
    process.kill()


def attach(page, *paths: Path) -> None:
    page.set_input_files("#attach input[type=file]", [str(p) for p in paths])
    for path in paths:
        page.wait_for_function(f"() => ({CHIPS_JS[6:]}).includes({path.name!r})")


def drop(page, name: str, text: str) -> None:
    """A file dropped on the message box, as a file manager drops one."""
    page.evaluate(
        """([name, text]) => {
            const data = new DataTransfer();
            data.items.add(new File([text], name, {type: 'text/plain'}));
            const box = document.querySelector('#message textarea');
            const init = {dataTransfer: data, bubbles: true, cancelable: true};
            box.dispatchEvent(new DragEvent('dragover', init));
            box.dispatchEvent(new DragEvent('drop', init));
        }""",
        [name, text],
    )
    page.wait_for_function(f"() => ({CHIPS_JS[6:]}).includes({name!r})")


def revise(page, instruction: str) -> str:
    """Run an instruction in the edit pane; the diff's "N lines changed" once it is in."""
    page.evaluate("() => { const c = document.querySelector('#canvas-changed'); if (c) c.remove(); }")
    page.fill("#canvas-instruction textarea", instruction)
    page.click("#canvas-run")
    page.wait_for_function(f"() => ({CHANGED_JS[6:]}).length > 0")
    return page.evaluate(CHANGED_JS)


def cli_revision(tmp_path: Path, name: str, text: str, instruction: str) -> str:
    """The same edit through ``edgespec generate --prediction``: the canvas must equal it."""
    original = tmp_path / "original.txt"
    original.write_text(text, encoding="utf-8")
    command = [sys.executable, "-m", "edgespec.cli.main", "generate", "--chat", "--ctx", "2048",
               "--max-tokens", "1024", "--prediction", str(original),
               "--prompt", edit_prompt(name, text, instruction)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    return revision_from_answer(result.stdout, text)


def test_attach_ask_edit_accept_and_edit_again(app: AppProcess, tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    OUTPUT_DIR.mkdir(exist_ok=True)
    code = tmp_path / "sums.py"
    code.write_text(CODE, encoding="utf-8")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = open_page(browser, app.url)
            unfold(page, "#settings-panel", "#max-tokens")
            page.fill("#max-tokens input[type=number]", "24")
            page.keyboard.press("Tab")
            attach(page, code)
            assert "tokens" in page.evaluate(CHIPS_JS)
            expect(page.locator("#attach-cost")).to_contain_text("of 2,048")
            ask(page, "What does the function twice return for 21? Answer with the number only.")
            assert "42" in page.evaluate(
                "() => [...document.querySelectorAll('#chatbot .bot-row')].pop().innerText"
            )
            expect(page.locator("#chatbot")).to_contain_text("sums.py")
            assert page.evaluate(CHIPS_JS) == ""  # sent: the files went with the message

            # The edit pane on the chat's file: the revision streams, then its diff.
            page.click("#canvas-open")
            expect(page.locator("#canvas")).to_be_visible()
            expect(page.locator("#canvas-title")).to_contain_text("sums.py")
            changed = revise(page, INSTRUCTION)
            shown = page.locator("#canvas-view pre").inner_text()
            assert "def plus(a, b):" in shown and "return plus(x, x)" in shown, shown
            with page.expect_download() as download:
                page.click("#canvas-download")
            assert download.value.suggested_filename == "sums.py"
            downloaded = Path(download.value.path()).read_text(encoding="utf-8")
            assert downloaded.strip() == shown.strip()
            # The diff marks exactly the lines that changed: the two that name add.
            diff = line_diff(CODE, downloaded)
            assert changed == f"{diff.changed} lines changed" and diff.changed >= 2, (changed, downloaded)
            marked = page.locator("#canvas-diff .diff-add .diff-text").all_inner_texts()
            assert [line.removeprefix("+").strip() for line in marked] == [
                line.strip() for line in downloaded.splitlines() if line not in CODE.splitlines()
            ], marked
            assert downloaded == cli_revision(tmp_path, "sums.py", CODE, INSTRUCTION)

            # Accepted, the revision is the file; the next instruction edits it.
            page.click("#canvas-accept")
            expect(page.locator("#canvas-title")).to_contain_text("accepted")
            changed = revise(page, "Rename the function twice to double everywhere in the file.")
            shown = page.locator("#canvas-view pre").inner_text()
            # It edited the accepted revision: no trace of the name the first edit removed.
            # (Its argument's name is the model's choice: greedy runs may part at near-ties.)
            assert "def double(" in shown and "def twice(" not in shown and "add(" not in shown, shown
            page.screenshot(path=str(OUTPUT_DIR / "app_canvas.png"))

            # A file dropped on the message box is attached as one chosen is.
            drop(page, "notes.md", "# Notes\n\nThe launch code is PELICAN-7.\n")
            ask(page, "What is the launch code in notes.md? Answer with the code only.")
            assert "PELICAN-7" in page.evaluate(
                "() => [...document.querySelectorAll('#chatbot .bot-row')].pop().innerText"
            )
        finally:
            browser.close()


def test_branch_folders_and_a_file_too_big(app: AppProcess, tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    big = tmp_path / "big.txt"
    big.write_text("\n".join(f"line {n}: the quick brown fox jumps over the lazy dog" for n in range(400)))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = open_page(browser, app.url)
            unfold(page, "#settings-panel", "#max-tokens")
            page.fill("#max-tokens input[type=number]", "16")
            page.keyboard.press("Tab")
            ask(page, "Name one primary colour, one word.")
            ask(page, "Name another one, one word.")
            # Branch from the first answer: a new chat of its first two messages.
            page.locator("#chatbot .message-row").nth(1).locator(".branch-button").click()
            page.wait_for_function("() => document.querySelectorAll('#chats label').length >= 2")
            assert listed(page)[0].endswith("(branch)"), listed(page)
            page.wait_for_function(f"() => {BUBBLES_JS[6:]} === 2")
            ask(page, "Name a secondary colour, one word.")
            assert page.evaluate(BUBBLES_JS) == 4

            # Folders: made, a chat begun in one is listed there, every chat under "All chats".
            unfold(page, "#folder-actions", "#folder-name")
            page.fill("#folder-name textarea", "Work")
            page.click("#folder-new")
            expect(page.locator("#chats label")).to_have_count(0)
            page.click("#new-chat")
            page.wait_for_function(f"() => {BUBBLES_JS[6:]} === 0")  # the new chat is open
            ask(page, "Say hello, one word.")
            expect(page.locator("#chats label")).to_have_count(1)
            page.click("#folders input")
            page.click("ul[role=listbox] li:text-is('All chats')")
            expect(page.locator("#chats label")).to_have_count(3)

            # A file is read ahead while the question is typed, and the chip says how far;
            # removed from the message, it leaves nothing behind in it.
            medium = tmp_path / "inventory.csv"
            medium.write_text("\n".join(f"{n},widget-{n * 7 % 101},{n * 13 % 97} units" for n in range(120)))
            attach(page, medium)
            page.wait_for_function(f"() => ({CHIPS_JS[6:]}).includes('read 100 %')")
            page.click("#attach button[aria-label='Clear'], #attach button[title='Clear']")
            page.wait_for_function(f"() => ({CHIPS_JS[6:]}) === ''")

            # A file over the context: one line naming both numbers; the box keeps both.
            attach(page, big)
            page.fill("#message textarea", "Summarise the file.")
            page.press("#message textarea", "Enter")
            expect(page.locator("#error-box")).to_contain_text("2048")
            error = page.locator("#error-box").inner_text()
            assert "the prompt is" in error and "tokens" in error, error
            assert page.input_value("#message textarea") == "Summarise the file."
            assert "big.txt" in page.evaluate(CHIPS_JS)
            wait_idle(page)
        finally:
            browser.close()
