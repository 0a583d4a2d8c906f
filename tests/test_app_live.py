"""The chat app's live feed (pure, no models): what each message to the page carries while
an answer runs, and the page script's <head> injection, over a real loopback socket."""

from __future__ import annotations

import html
import re

from edgespec.decoding.events import BONUS, DRAFT, PLAIN, Done, Stats, Step, Token
from edgespec.ui.answer import AnswerRun
from edgespec.ui.live import SMOOTH, WAITING_HTML, Feed, FeedReader, LiveFeeds

SPANS = re.compile(r'<span class="prov prov-(\w+)"[^>]*>([^<]*)</span>')


def token(text: str, source: str = PLAIN) -> Token:
    return Token(1, text, source)


def step(gamma: int, accepted: int) -> Step:
    return Step("model" if gamma else "none", gamma, accepted, 0.01, 0.02, planned_gamma=gamma)


def spans(markup: str) -> list[tuple[str, str]]:
    return [(source, html.unescape(text)) for source, text in SPANS.findall(markup)]


def test_text_is_appended_once_and_whole_in_order():
    run = AnswerRun()
    reader = FeedReader(Feed(run, colour=False, waiting=False))
    run.add(token("def <f>"))
    first = reader.message(0.0)
    # The first message clears the placeholder, then brings everything so far.
    assert first["replace"]["answer"] == ""
    assert first["append"]["answer"] == html.escape("def <f>")
    run.add(step(3, 2))
    for text, source in [("(x", DRAFT), ("):", DRAFT), ("\n    ", BONUS)]:
        run.add(token(text, source))
    second = reader.message(0.1)
    assert "answer" not in second["replace"], "only the first message replaces the text"
    assert html.unescape(second["append"]["answer"]) == "(x):\n    "
    assert reader.message(0.2)["append"] == {}, "nothing new, nothing appended"
    pieces = [first["append"]["answer"], second["append"]["answer"]]
    assert html.unescape("".join(pieces)) == run.text


def test_a_coloured_answer_is_sent_as_rendered_blocks_each_closed_one_once():
    run = AnswerRun()
    reader = FeedReader(Feed(run, colour=True, waiting=False))
    run.add(token("def"))
    first = reader.message(0.0)
    # The placeholder cleared, then the answer so far: its open block in the tail slot.
    assert first["replace"]["answer"] == ""
    assert 'class="live-slot-answer-tail"' in first["append"]["answer"]
    assert spans(first["append"]["answer"]) == [(PLAIN, "def")]
    run.add(step(3, 2))
    for text, source in [("(x", DRAFT), ("):", DRAFT), ("\n\n**bo", BONUS)]:
        run.add(token(text, source))
    second = reader.message(0.1)
    # The first paragraph is closed: appended (before the tail slot); the open one is
    # replaced in the tail slot, its bold drawn closed, its asterisks never shown.
    closed, tail = second["append"]["answer"], second["replace"]["answer-tail"]
    assert closed.startswith("<p>") and spans(closed) == [(PLAIN, "def"), (DRAFT, "(x):")]
    assert "<strong>" in tail and spans(tail) == [(BONUS, "bo")] and "*" not in tail
    run.add(token("ld**", DRAFT))
    third = reader.message(0.2)
    assert "answer" not in third["append"], "a closed block is sent once"
    assert spans(third["replace"]["answer-tail"]) == [(BONUS, "bo"), (DRAFT, "ld")]
    run.add(Done(text=run.text, tail="", stop_reason="eos", stats=Stats(tokens=5)))
    reader.feed.finished = True
    last = reader.message(0.3)
    assert spans(last["append"]["answer"]) == [(BONUS, "bo"), (DRAFT, "ld")], "the end closes the last block"
    assert last["replace"]["answer-tail"] == ""


def test_small_panels_are_replaced_at_most_every_interval_and_at_the_end():
    run = AnswerRun()
    feed = Feed(run, colour=True, waiting=False)
    reader = FeedReader(feed)
    run.add(token("a"))
    assert {"legend", "gauge", "stats"} <= set(reader.message(10.0)["replace"])
    run.add(token("b"))
    assert "stats" not in reader.message(10.0 + SMOOTH.panels_s / 2)["replace"]
    run.add(token("c"))
    later = reader.message(10.0 + SMOOTH.panels_s)["replace"]
    assert "3 tokens" in re.sub(r"<[^>]+>", "", later["stats"])
    run.add(Done(text="abc", tail="", stop_reason="eos", stats=Stats(tokens=3)))
    feed.finished = True
    assert "gauge" in reader.message(10.0 + SMOOTH.panels_s + 0.01)["replace"], "the end is always shown"


def test_a_waiting_answer_says_so_and_a_recolour_resends_the_text_whole():
    run = AnswerRun()
    feed = Feed(run, colour=True, waiting=True)
    reader = FeedReader(feed)
    assert reader.message(0.0) == {"replace": {"stats": WAITING_HTML}}
    feed.waiting = False
    run.add(token("x", DRAFT))
    assert spans(reader.message(0.1)["append"]["answer"]) == [(DRAFT, "x")]
    feed.colour, feed.shown = False, feed.shown + 1
    again = reader.message(0.2)
    assert again["replace"]["answer"] == "" and again["append"]["answer"] == "x", "plain text, whole"


def test_feeds_are_kept_by_unguessable_id_and_the_oldest_dropped():
    feeds = LiveFeeds(kept=2)
    ids = [feeds.open(Feed(AnswerRun(), colour=True)) for _ in range(3)]
    assert len(set(ids)) == 3 and all(len(i) >= 16 for i in ids)
    assert feeds.get(ids[0]) is None and feeds.get(ids[2]) is not None
    assert feeds.get("guess") is None


def test_the_page_script_comes_first_and_a_feed_streams_over_loopback():
    import json
    import socket

    import httpx

    from edgespec.ui.layout import build_app, launch_app
    from edgespec.ui.live import LIVE_PATH, PAGE_SCRIPT

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = build_app(None, load_error="no model here")
    launch_app(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        base = f"http://127.0.0.1:{port}"
        page = httpx.get(f"{base}/", timeout=30)
        assert page.status_code == 200
        # Before any of Gradio's scripts, so it is in place when they load.
        assert page.content.index(PAGE_SCRIPT) == page.content.index(b"<script")
        assert page.content.count(PAGE_SCRIPT) == 1
        assert httpx.get(f"{base}/{LIVE_PATH}/nothing-here", timeout=30).status_code == 404

        run = AnswerRun()
        run.add(token("hello"))
        feed = Feed(run, colour=False, waiting=False, finished=True)
        feed_id = demo.live_feeds.open(feed)
        with httpx.stream("GET", f"{base}/{LIVE_PATH}/{feed_id}", timeout=30) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            body = "".join(response.iter_text())
        data = [json.loads(line[6:]) for line in body.splitlines() if line.startswith('data: {"')]
        assert data[0]["append"]["answer"] == "hello"
        assert "event: done" in body
    finally:
        demo.close()


def test_a_pasted_function_keeps_its_indentation_in_the_chat_and_the_model_gets_it_as_typed():
    from edgespec.ui.chat_store import StoredMessage
    from edgespec.ui.views import chat_messages

    typed = "Fix this:\ndef f(x):\n    if x:\n\treturn 1\n```\n    fenced stays\n```"
    user, answer = chat_messages([StoredMessage("user", typed), StoredMessage("assistant", "  ok")])
    drawn = user["content"][0]["text"].split("\n")
    assert drawn[2] == "\u00a0" * 4 + "if x:" and drawn[3] == "\u00a0" * 4 + "return 1"
    assert drawn[5] == "    fenced stays", "inside a fence Markdown keeps it already"
    assert answer["content"][0]["text"] == "  ok", "answers are drawn as written"
