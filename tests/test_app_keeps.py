"""The app a person keeps, tried as a person would, in real headless Chromium against
``app.py`` in its own process: chats made, the app closed with Ctrl-C and started again,
every chat still listed with its messages and the one in the pair's cache marked warm;
a system prompt that changes the answer; rename, search, delete (after confirming);
regenerate and edit-and-resend; export as Markdown and JSON, and the JSON imported again;
Enter, Shift+Enter and Escape. And the answer a chat reopened after a restart gives (its
prompt state read back from disk) is the one it gives without the restart."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from edgespec.ui.chat_store import ChatStore
from edgespec.ui.library import WARM_MARK
from edgespec.ui.views import View
from tests.app_process import AppProcess
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS, OUTPUT_DIR, unfold

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_models,
    pytest.mark.filterwarnings("ignore:'future.no_silent_downcasting' is deprecated"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

TIMEOUT_MS = 300_000
OUT = {name: index for index, name in enumerate(View.names())}
CHAT_TEXT_JS = "() => document.querySelector('#chatbot')?.innerText || ''"
BUBBLES_JS = "() => document.querySelectorAll('#chatbot .message-row').length"
GREEDY = {"system": "", "drafter": "auto", "gamma": "auto", "verify": "token", "temperature": 0.0,
          "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": "", "max_tokens": 40, "lenience": 1.0,
          "colour": False}  # fmt: skip


@pytest.fixture
def app(tmp_path: Path) -> Iterator[AppProcess]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (make test installs it)")
    process = AppProcess(tmp_path / "data", tmp_path / "cache").start()
    yield process
    process.kill()


def listed(page, marks: bool = False) -> list[str]:
    """The chat list's titles, as drawn (``marks``: with their warm marks)."""
    titles = [label.strip() for label in page.locator("#chats label").all_inner_texts()]
    return titles if marks else [title.removesuffix(WARM_MARK) for title in titles]


def ask(page, question: str) -> None:
    """Type and press Enter; wait until the answer is in and the list says so."""
    before = page.evaluate(BUBBLES_JS)
    page.fill("#message textarea", question)
    page.press("#message textarea", "Enter")
    page.wait_for_function(f"() => {BUBBLES_JS[6:]} >= {before + 2}", timeout=TIMEOUT_MS)
    wait_idle(page)


# Before an action that starts an answer: notes the answer's live bubble the moment it is
# drawn, however soon the end takes it away again (a fast machine may answer between two
# looks of the test's own).
WATCH_ANSWER_JS = """() => {
    window.answerWatch?.disconnect();
    window.answerSeen = false;
    const look = () => { window.answerSeen ||= !!document.querySelector('#chatbot .live-slot-answer'); };
    window.answerWatch = new MutationObserver(look);
    window.answerWatch.observe(document.body, {childList: true, subtree: true});
}"""


def answered(page, act) -> None:
    """Do ``act`` (a click that starts an answer) and wait for that answer's end."""
    page.evaluate(WATCH_ANSWER_JS)
    act()
    page.wait_for_function("() => window.answerSeen", timeout=TIMEOUT_MS)
    wait_idle(page)


def wait_idle(page) -> None:
    """Until the answer's last panels are drawn: the live feed has let go of the chat."""
    page.wait_for_function(
        "() => !document.querySelector('#chatbot .live-slot-answer')", timeout=TIMEOUT_MS, polling=200
    )
    time.sleep(0.5)


def open_page(browser, url: str, width: int = 1280, height: int = 800):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": height}, accept_downloads=True)
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)  # its own default is 5 s: short on a busy machine
    page.goto(url)
    page.wait_for_selector("#message textarea")
    return page


def test_the_app_keeps_chats_across_a_restart(app: AppProcess):
    from playwright.sync_api import expect, sync_playwright

    OUTPUT_DIR.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = open_page(browser, app.url)
            unfold(page, "#settings-panel", "#max-tokens")
            page.fill("#max-tokens input[type=number]", "24")
            page.keyboard.press("Tab")
            # Shift+Enter is a new line, not a message.
            page.fill("#message textarea", "first line")
            page.press("#message textarea", "Shift+Enter")
            page.keyboard.type("second line")
            assert page.input_value("#message textarea") == "first line\nsecond line"
            assert page.evaluate(BUBBLES_JS) == 0
            ask(page, "Name one primary colour, one word.")
            first = page.evaluate(CHAT_TEXT_JS)
            # A second chat, with a system prompt that shows in its answer.
            page.click("#new-chat")
            page.wait_for_function(f"() => {BUBBLES_JS[6:]} === 0")  # the new chat is open
            page.fill("#system textarea", "You always answer in French.")
            ask(page, "Say good morning.")
            french = page.evaluate(CHAT_TEXT_JS).lower()
            assert "bonjour" in french, french
            # The list is read again once the answer is in, in an event after its last.
            expect(page.locator("#chats label")).to_have_count(2)
            assert listed(page)[:2] == ["Say good morning.", "Name one primary colour, one word."]
            # Escape stops an answer: held in flight by a budget no machine decodes before
            # the test looks (the story is stopped long before 1024 tokens).
            page.click("#new-chat")
            page.wait_for_function(f"() => {BUBBLES_JS[6:]} === 0")
            page.fill("#max-tokens input[type=number]", "1024")
            page.keyboard.press("Tab")
            page.fill("#message textarea", "Write a long story about a lighthouse keeper.")
            page.press("#message textarea", "Enter")
            page.wait_for_selector("#chatbot .live-slot-answer")
            streaming = "() => document.querySelector('#chatbot .live-slot-answer')?.innerText.length > 20"
            page.wait_for_function(streaming)
            page.keyboard.press("Escape")
            wait_idle(page)
            page.screenshot(path=str(OUTPUT_DIR / "app_keeps_before_restart.png"))
        finally:
            browser.close()

        app.stop()
        app.start()

        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = open_page(browser, app.url)
            page.wait_for_function("() => document.querySelectorAll('#chats label').length >= 3")
            titles = listed(page, marks=True)
            plain = listed(page)
            assert plain == ["Write a long story about a lighthouse keeper.", "Say good morning.",
                             "Name one primary colour, one word."], titles  # fmt: skip
            assert any(t.endswith(WARM_MARK) for t in titles), f"no chat came back warm: {titles}"
            # The newest chat is open, the others a click away, each with its messages.
            expect(page.locator("#chatbot")).to_contain_text("lighthouse keeper")
            page.click("#chats label:has-text('Name one primary colour')")
            expect(page.locator("#chatbot")).to_contain_text("Name one primary colour")
            assert page.evaluate(CHAT_TEXT_JS) == first
            page.click("#chats label:has-text('Say good morning')")
            expect(page.locator("#system textarea")).to_have_value("You always answer in French.")

            # Regenerate: the last answer again (greedy: the same), nothing added.
            bubbles = page.evaluate(BUBBLES_JS)
            answered(page, lambda: page.click("#regenerate"))
            assert page.evaluate(BUBBLES_JS) == bubbles
            assert "bonjour" in page.evaluate(CHAT_TEXT_JS).lower()
            # Edit the question in the chat and send it: it is answered anew, in place.
            page.click("#chatbot button[aria-label='Edit']")
            page.fill("#chatbot textarea", "Say good night.")
            submit = "#chatbot button[aria-label='Submit'], #chatbot button[title='Submit']"
            answered(page, lambda: page.click(submit))
            assert page.evaluate(BUBBLES_JS) == bubbles
            edited = page.evaluate(CHAT_TEXT_JS)
            assert "Say good night." in edited and "Say good morning." not in edited, edited

            # Rename, search, export, import, delete.
            unfold(page, "#chat-actions", "#rename")
            page.fill("#rename textarea", "French greetings")
            page.click("#rename-button")
            expect(page.locator("#chats")).to_contain_text("French greetings")
            page.fill("#chat-search textarea", "primary colour")
            expect(page.locator("#chats label")).to_have_count(1)
            page.fill("#chat-search textarea", "")
            expect(page.locator("#chats label")).to_have_count(3)
            exported = export(page, "#export-md", ".md")
            assert "# French greetings" in exported and "Say good night." in exported
            assert "You always answer in French." in exported
            document = json.loads(export(page, "#export-json", ".json"))
            assert [m["role"] for m in document["messages"]] == ["user", "assistant"]
            json_file = app.data.parent / "chat.json"
            json_file.write_text(json.dumps(document))
            with page.expect_file_chooser() as chooser:
                page.click("#import-json")
            chooser.value.set_files(str(json_file))
            expect(page.locator("#chats label")).to_have_count(4)
            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#delete-chat")
            expect(page.locator("#chats label")).to_have_count(3)
            page.screenshot(path=str(OUTPUT_DIR / "app_keeps_after_restart.png"))
        finally:
            browser.close()
        app.stop()
    store = ChatStore.open(app.data)
    titles = [s.title for s in store.summaries()]
    store.close()
    assert titles.count("French greetings") == 1, titles  # the copy imported was deleted


# The address of the file the export panel offers ("" before any): Gradio serves it at
# .../gradio_api/file=<its own folder>/<name>, so an export's suffix ends it.
EXPORT_HREF_JS = "() => document.querySelector('#export-file a[download]')?.href || ''"


def export(page, button: str, suffix: str) -> str:
    """The text of the file an export button offers for download: the one this click put
    up (its name ends with ``suffix``), never one an earlier export left in the panel, which
    stays there until the click's answer replaces it."""
    before = page.evaluate(EXPORT_HREF_JS)
    page.click(button)
    offered = page.wait_for_function(
        f"([before, suffix]) => {{ const href = ({EXPORT_HREF_JS})();"
        " return href !== before && href.endsWith(suffix) && href; }",
        arg=[before, suffix],
    )
    return httpx.get(offered.json_value(), timeout=30).text


def test_a_chat_reopened_after_a_restart_answers_as_without_it(app: AppProcess):
    """The follow-up's prompt comes back from the state file; its answer is the one the
    same follow-up got from the state still in memory (greedy)."""
    client = Client(app.url, verbose=False)
    question, follow_up = "Write a Python function that adds two numbers.", "Now make it multiply instead."
    client.predict(question, **GREEDY, api_name="/chat")
    warm = client.predict(follow_up, **GREEDY, api_name="/chat")
    before = warm[OUT["chatbot"]][-1]["content"][0]["text"]
    chat_id = client.predict("", api_name="/new_chat")[len(View.names())]["choices"][0][1]
    client.close()
    app.stop()
    app.start()
    client = Client(app.url, verbose=False)
    client.predict("", api_name="/new_chat")  # lists the chats, as the page does when it opens
    client.predict(chat_id, api_name="/open_chat")
    client.predict(2, follow_up, api_name="/edit_message")  # the follow-up asked again
    again = client.predict("", **GREEDY, api_name="/chat")
    client.close()
    after = again[OUT["chatbot"]][-1]["content"][0]["text"]
    assert [m["role"] for m in again[OUT["chatbot"]]] == ["user", "assistant"] * 2
    stats = again[OUT["stats"]]
    reused = int(stats.split(" reused")[0].rsplit(",", 1)[1].split()[0])
    assert reused > 30, f"the reopened chat read its whole prompt again: {stats}"
    assert after == before
