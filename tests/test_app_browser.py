"""The chat app end to end in real headless Chromium (Debian's /usr/bin/chromium), against
the real default model pair: streaming text, the live gauge, the colouring toggle, a
second tab that visibly waits its turn, and what the legend, the step chart and the gauge
say of an answer with drafts and of one without. Leaves screenshots in test-output/."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.decoding.drafters import CHOICES, NONE_COLOUR, REGISTRY
from edgespec.ui.figures import DRAFTED_NAME, NO_DRAFT_NAME
from edgespec.ui.layout import build_app, launch_app
from lab.app_cost import unfold

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_models,
    # Gradio's own queue metrics trip pandas 3 deprecations: noise, not ours to fix.
    pytest.mark.filterwarnings("ignore:'future.no_silent_downcasting' is deprecated"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT_DIR = Path(__file__).resolve().parent.parent / "test-output"
TIMEOUT_MS = 300_000  # generous: two CPU cores, possibly shared with other work
LAST_ANSWER_JS = """() => {
    const bots = document.querySelectorAll('#chatbot .bot-row .message-content');
    return bots.length ? bots[bots.length - 1].innerText : '';
}"""
# The streamed text, from the answer's bubble while it streams (plain, or its rendered
# blocks in coloured spans, no marker ever shown then taken back): it only ever grows.
STREAMED_TEXT_JS = """() => document.querySelector('#chatbot .live-slot-answer')?.textContent || ''"""
# The legend chips as drawn: provenance, token count, label.
LEGEND_JS = """() => [...document.querySelectorAll('#legend [data-legend]')]
    .map(e => [e.dataset.legend, Number(e.dataset.count), e.textContent])"""
# The provenance of the last answer's coloured spans, in the chat itself.
LAST_SPANS = (
    "[...(([...document.querySelectorAll('#chatbot .bot-row')].pop()) || document).querySelectorAll('.prov')]"
)
SOURCES_JS = f"""() => [...new Set({LAST_SPANS}.map(e => [...e.classList].find(c => c.startsWith('prov-'))
    .slice(5)))]"""
LAST_TEXT_JS = f"() => {LAST_SPANS}.map(e => e.textContent).join('')"
# The step chart's series, as the page drew them (each mark keeps its step's value).
CHART_JS = """() => [...document.querySelectorAll('#steps-plot g.series')].map(g => ({
    name: g.dataset.series, colour: g.dataset.colour,
    y: [...g.querySelectorAll('[data-step]')].map(m => Number(m.dataset.y))}))"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is not installed (make test installs it; or: apt-get install -y chromium)"
        print(f"skipping the browser test: {reason}")
        pytest.skip(reason)
    lm = EdgeSpec(options=RuntimeOptions(engine_thread=True), quiet=True)  # as app.py loads it
    demo = build_app(lm)
    port = free_port()
    launch_app(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()
    # A failed test can leave an answer running in Gradio's worker thread: close ends it,
    # and frees the models only once it let go of them.
    lm.close()


def open_app(browser, url: str):
    from playwright.sync_api import expect

    context = browser.new_context(
        viewport={"width": 1400, "height": 1200}, permissions=["clipboard-read", "clipboard-write"]
    )
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)  # its own default is 5 s: short on a busy machine
    page.goto(url)
    page.wait_for_selector("#message textarea")
    for panel, inside in (
        ("#settings-panel", "#drafter"),
        ("#stats-panel", "#steps-plot"),
        ("#steps-panel", "#steps-table"),
    ):
        unfold(page, panel, inside)
    # The drafter options are the registry's, every one of them offered.
    page.locator("#drafter label").first.wait_for()
    offered = [t.strip() for t in page.locator("#drafter label").all_inner_texts()]
    assert offered == list(CHOICES), offered
    # Fixed drafting through the UI's own controls: the gauge must have drafts to show.
    page.click("#drafter label:has-text('model')")
    page.click("#gamma input")
    page.click("ul[role=listbox] li:text-is('4')")
    set_max_tokens(page, 32)
    return page


HELD_MAX_TOKENS = 1024
SLOT = "#chatbot .live-slot-answer"  # an answer's bubble while its feed writes it
ROWS_JS = "() => document.querySelectorAll('#chatbot .message-row').length"


def new_chat(page) -> None:
    """A new chat, open before anything is typed into it: it clears the message box, so a
    message typed before its answer came would be lost (on a busy machine it comes late)."""
    from playwright.sync_api import expect

    page.fill("#message textarea", "typed before the new chat")
    page.click("#new-chat")
    expect(page.locator("#message textarea")).to_have_value("")


def set_max_tokens(page, count: int) -> None:
    page.fill("#max-tokens input[type=number]", str(count))
    page.keyboard.press("Tab")


def gauge_accepted(page) -> int:
    """The gauge's big number, as the page drew it ("3 / 4" → 3); -1 before it exists."""
    numbers = page.locator("#gauge .number")
    if numbers.count() == 0:
        return -1
    match = re.match(r"\s*(\d+)", numbers.first.text_content() or "")
    return int(match.group(1)) if match else -1


def copied_by(page, button) -> str:
    """What a copy button puts on the clipboard: its write is a promise, waited for (the
    clipboard emptied first, so that what an earlier button copied is never read)."""
    page.evaluate("navigator.clipboard.writeText('')")
    button.click()
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not (text := page.evaluate("navigator.clipboard.readText()")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return text


def coloured_spans(page) -> int:
    return page.evaluate(f"() => {LAST_SPANS}.length")


def chart(page, names_wanted) -> list[dict]:
    """The step chart's series once they satisfy ``names_wanted`` (the answer's last
    update draws it), or as they are after a few seconds."""
    traces: list[dict] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        traces = page.evaluate(CHART_JS) or []
        if names_wanted({trace["name"] for trace in traces}):
            break
        time.sleep(0.1)
    return traces


def legend(page) -> dict[str, tuple[int, str]]:
    return {source: (count, label) for source, count, label in page.evaluate(LEGEND_JS)}


def check_chart_colours(traces: list[dict]) -> None:
    """No chart colour may pass for a provenance colour of the text beside it (the grey
    of steps with no draft is the provenance grey on purpose: both mean no draft)."""
    from test_palette import DISTINCT, SOLID, delta_e

    for trace in traces:
        colour = trace["colour"]
        if trace["name"] in (NO_DRAFT_NAME, DRAFTED_NAME):
            continue
        for source, solid in SOLID.items():
            assert delta_e(colour, solid) >= DISTINCT, f"{trace['name']} {colour} looks like {source} {solid}"


def check_drafted_answer(page) -> None:
    """Legend, chart and gauge of an answer drafted by the model at γ = 4."""
    chips = legend(page)
    assert list(chips) == ["draft", "target", "bonus", "plain"], chips
    assert "correction" in chips["target"][1] and "target, no draft" in chips["plain"][1]
    assert chips["draft"][0] > 0
    assert chips["plain"][0] >= 1, "the first token has no draft behind it"
    traces = {trace["name"]: trace for trace in chart(page, lambda names: "accepted (model)" in names)}
    model = traces["accepted (model)"]
    assert model["colour"] == REGISTRY["model"].colour and max(model["y"]) > 0
    check_chart_colours(list(traces.values()))
    if NO_DRAFT_NAME in traces:  # steps with no draft sit at 0, never as a token
        assert set(traces[NO_DRAFT_NAME]["y"]) == {0}
    gauge = page.locator("#gauge")
    expect_text(gauge, "whole answer:")
    expect_text(gauge, "drafted tokens accepted, τ")


def check_plain_answer(page) -> None:
    """Legend, chart and gauge of an answer with drafter none: nothing is a correction."""
    chips = legend(page)
    assert chips["plain"][0] > 0
    assert chips["draft"][0] == chips["target"][0] == chips["bonus"][0] == 0, chips
    assert page.evaluate(SOURCES_JS) == ["plain"]
    traces = chart(page, lambda names: names == {NO_DRAFT_NAME})
    assert [trace["name"] for trace in traces] == [NO_DRAFT_NAME]
    assert len(traces[0]["y"]) >= 2, "one mark per step, at 0"
    assert set(traces[0]["y"]) == {0} and traces[0]["colour"] == NONE_COLOUR
    expect_text(page.locator("#gauge"), "no drafting in this answer")
    assert "waiting" not in (page.locator("#gauge").text_content() or "")
    assert "fixed setting" in page.inner_text("#steps-table")


def expect_text(locator, text: str) -> None:
    from playwright.sync_api import expect

    expect(locator).to_contain_text(text)


def test_chat_in_a_real_browser(app_url: str):
    from playwright.sync_api import expect, sync_playwright

    OUTPUT_DIR.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = open_app(browser, app_url)
            waiting = open_app(browser, app_url)
            waiting.fill("#message textarea", "Say hello in one word.")
            withdrawn = open_app(browser, app_url)
            withdrawn.fill("#message textarea", "Say goodbye in one word.")

            new_chat(page)
            # Held in flight by a budget no machine decodes before the test has seen what
            # it looks for; then stopped (the answer measured further on is another one).
            set_max_tokens(page, HELD_MAX_TOKENS)
            page.fill("#message textarea", "Write a Python function that checks whether a number is prime.")
            page.keyboard.press("Enter")

            # Watch the answer grow, and the gauge move, while it streams.
            lengths: list[int] = []
            best_gauge = -1
            sent = queued_seen = False
            text = ""
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while time.monotonic() < deadline:
                text = page.evaluate(STREAMED_TEXT_JS)
                if text and (not lengths or len(text) != lengths[-1]):
                    lengths.append(len(text))
                best_gauge = max(best_gauge, gauge_accepted(page))
                if lengths and not sent:
                    # The first tab is busy: the second one sends now and must be told it
                    # waits; the third sends and withdraws its question before its turn.
                    waiting.keyboard.press("Enter")
                    withdrawn.keyboard.press("Enter")
                    expect(withdrawn.locator("body")).to_contain_text("Waiting for your turn")
                    withdrawn.click("#stop")
                    sent = True
                if sent and not queued_seen:
                    body = waiting.inner_text("body")
                    queued_seen = "Waiting for your turn" in body or bool(re.search(r"queue: ?\d+/\d+", body))
                if "tokens/s" in page.inner_text("#stats"):
                    break  # over before the test saw what it waits for: the asserts say what
                if len(lengths) >= 3 and queued_seen and "def " in text:
                    page.click("#stop")
                    break
                time.sleep(0.1)
            expect(page.locator("#stats")).to_contain_text("tokens/s")  # the stopped answer's own
            assert "(stopped)" in page.inner_text("#stats"), "the answer ended before the test stopped it"
            assert len(lengths) >= 3, f"the answer did not stream: lengths seen {lengths}"
            assert lengths == sorted(lengths) and lengths[-1] > lengths[0]
            assert page.evaluate(LAST_ANSWER_JS), "the answer is in the chat"
            best_gauge = max(best_gauge, gauge_accepted(page))
            assert best_gauge > 0, "the gauge never showed an accepted draft token"
            assert queued_seen, "the second tab never showed that it was waiting"

            # Colouring on: the answer in the chat is provenance spans; off: its Markdown.
            expect(page.locator("#chatbot .prov.prov-draft").first).to_be_visible()
            coloured_text = page.evaluate(LAST_TEXT_JS)
            assert coloured_spans(page) > 0 and "def " in coloured_text
            assert page.locator("#provenance").count() == 0, "the answer is shown once"
            # Its copy button copies the answer's Markdown, not the markup that colours it
            # (and, below, just as it does with the colouring off).
            copy_buttons = page.locator("#chatbot button[aria-label='Copy message']")
            buttons = copy_buttons.count()
            copied = copied_by(page, copy_buttons.last)
            assert "def " in copied and "<span" not in copied, copied[:200]
            # A code block in it keeps its own copy button, which copies the code alone.
            code_blocks = page.locator("#chatbot .bot-row").last.locator("pre code")
            if code_blocks.count():
                code_button = page.locator("#chatbot .bot-row").last.locator("button.copy_code_button").first
                code = code_blocks.first.inner_text().strip()
                assert copied_by(page, code_button) == code and code in copied
            page.screenshot(path=str(OUTPUT_DIR / "app_browser.png"), full_page=True)
            page.click("#colour-toggle input")
            expect(page.locator("#legend")).to_contain_text("colouring off")
            page.wait_for_function(f"() => {LAST_SPANS}.length === 0")  # the chat drawn again, plain
            assert "def " in page.evaluate(LAST_ANSWER_JS)
            expect(copy_buttons).to_have_count(buttons)  # the answer's own, drawn again
            assert copied_by(page, copy_buttons.last) == copied
            page.click("#colour-toggle input")
            expect(page.locator("#chatbot .prov").first).to_be_visible()

            check_drafted_answer(page)

            # The waiting tab gets its answer once the first one is done.
            expect(waiting.locator("#stats")).to_contain_text("tokens/s", timeout=TIMEOUT_MS)
            assert waiting.evaluate(LAST_ANSWER_JS)
            second_shot = OUTPUT_DIR / "app_browser_second_tab.png"
            waiting.screenshot(path=str(second_shot), full_page=True)

            # Stopped while it waited: never answered, the question given back.
            expect(withdrawn.locator("#error-box")).to_contain_text("stopped before the first token")
            assert not withdrawn.evaluate(LAST_ANSWER_JS)
            assert withdrawn.input_value("#message textarea") == "Say goodbye in one word."

            # A stopped answer is not timed again: a speed-up figure for a follow-up that ran
            # to its end, the answer it was measured for, and for no other.
            set_max_tokens(page, 32)
            rows = page.evaluate(ROWS_JS)
            page.fill("#message textarea", "Now make it shorter.")
            page.keyboard.press("Enter")
            page.wait_for_function(f"() => {ROWS_JS[6:]} >= {rows + 2} && !document.querySelector({SLOT!r})")
            page.click("#measure")
            expect(page.locator("#speedup")).to_contain_text("speedup ×", timeout=TIMEOUT_MS)
            assert "ran 2 times" in page.inner_text("#speedup")

            # An answer with no drafting at all says so, everywhere.
            page.click("#drafter label:has-text('none')")
            new_chat(page)
            page.fill("#message textarea", "Count from 1 to 5, one number per line.")
            page.keyboard.press("Enter")
            expect(page.locator("#gauge")).to_contain_text("no drafting in this answer", timeout=TIMEOUT_MS)
            check_plain_answer(page)
            assert "×" not in page.inner_text("#speedup"), "the last answer's speed-up outlived it"
            plain_shot = OUTPUT_DIR / "app_browser_no_draft.png"
            page.screenshot(path=str(plain_shot), full_page=True)
            print(f"screenshots: {OUTPUT_DIR / 'app_browser.png'}, {second_shot} and {plain_shot}")
        finally:
            browser.close()


# Counts the animation frames the page's own scripts are given (it runs before the app's
# page script, so it sees only the frames that script lets through).
COUNT_FRAMES_JS = """(() => {
    const frame = window.requestAnimationFrame.bind(window);
    window.framesDrawn = 0;
    window.requestAnimationFrame = (callback) => frame((time) => { window.framesDrawn++; callback(time); });
})();"""


def test_an_idle_page_asks_for_no_frames(app_url: str):
    """Nothing changes on an idle page, so it draws (almost) nothing: Gradio's status
    tracker, and the animation loop a frame of it starts, would redraw it about 13 times a
    second, a share of a core that a decoding answer needs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1200})
            context.add_init_script(COUNT_FRAMES_JS)
            page = context.new_page()
            page.goto(app_url)
            page.wait_for_selector("#message textarea")
            # The first render's frames: until a second passes with none (on a busy machine
            # the first render takes longer than on an idle one).
            before, settle_by = page.evaluate("window.framesDrawn"), time.monotonic() + TIMEOUT_MS / 1000
            while time.monotonic() < settle_by:
                time.sleep(1)
                drawn, before = before, page.evaluate("window.framesDrawn")
                if drawn == before:
                    break
            time.sleep(4)
            drawn = page.evaluate("window.framesDrawn") - before
            assert drawn <= 4, f"an idle page drew {drawn} frames in 4 s"
        finally:
            browser.close()
