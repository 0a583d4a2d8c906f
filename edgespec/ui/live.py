"""The chat app's live view. While an answer decodes, the browser reads what its panels
show from a plain server-sent-event stream (``GET /edgespec/live/<feed>``): new text is
appended to its slots and the small panels are replaced, instead of Gradio event updates.

Why: on a machine whose cores llama.cpp keeps busy, every other runnable thread stalls the
decoding. A streamed Gradio update costs tens of milliseconds of CPU between the server
and the page whatever it holds, and Gradio's progress timer redraws the page 60 times a
second; together they took a large share of the app's decode rate (docs/app-cost.md). A feed
message is a few hundred bytes of JSON and a redraw of the lines that changed, and the
answer runs in an event with no outputs.
"""

from __future__ import annotations

import asyncio
import html
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse

from edgespec.runtime.system import default_threads
from edgespec.ui.answer import AnswerRun
from edgespec.ui.gauge import gauge_html
from edgespec.ui.markdown_colour import Answer, render_blocks
from edgespec.ui.page_files import FILES_HEAD
from edgespec.ui.text import (
    PROVENANCE_LABELS,
    live_stats_html,
    provenance_css,
    provenance_legend,
    provenance_pieces,
)

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

LIVE_PATH = "edgespec/live"


@dataclass(frozen=True)
class Pace:
    """How often the page is sent new text, and the small panels."""

    text_s: float
    panels_s: float

    @property
    def fold_s(self) -> float:
        """How often the answer's thread takes its events from the engine: a few times per
        message, so a message is at most that stale."""
        return self.text_s / 4


# New text five times a second (smooth to read, and appended, so cheap to draw), the small
# panels twice: where the machine has a core the decoding leaves free, or a GPU decodes.
SMOOTH = Pace(0.2, 0.5)
# Where llama.cpp's threads take every core, each message costs the decoding a measurable
# share of its rate (docs/app-cost.md): a software-rendered browser spends CPU on it (its
# main thread, compositor and raster threads), and each of those threads, like the server's event loop
# and the answer's own thread waking for its events, stalls a compute thread at its next
# barrier. New text once a second, the panels every 2 s.
SPARING = Pace(1.0, 2.0)
KEPT_FEEDS = 64  # feeds of recent answers a page may still connect to
WAITING_HTML = (
    "⏳ <b>Waiting for your turn</b>: another answer is being generated on the shared "
    "engine. Yours starts when it ends."
)
# Runs in the page once, in the hidden live panel: connects to the feed named in the
# panel and writes each fragment into the last element marked with its slot's name. What
# is appended to a slot goes before its own "-tail" slot where it has one: a coloured
# answer's closed blocks are appended, its open last block is replaced in its tail.
LIVE_JS = f"""
let source = null, feed = null;
const last = (name) => {{
  const slots = document.querySelectorAll(`.live-slot-${{name}}`);
  return slots.length ? slots[slots.length - 1] : null;
}};
const connect = () => {{
  const tag = element.querySelector('[data-feed]');
  const id = tag ? tag.dataset.feed : null;
  if (!id || id === feed) return;
  feed = id;
  if (source) source.close();
  source = new EventSource(new URL('{LIVE_PATH}/' + id, document.baseURI));
  source.onmessage = (event) => {{
    const message = JSON.parse(event.data);
    for (const [name, markup] of Object.entries(message.replace || {{}})) {{
      const slot = last(name);
      if (slot) slot.innerHTML = markup;
    }}
    for (const [name, markup] of Object.entries(message.append || {{}})) {{
      const slot = last(name);
      if (!slot) continue;
      // A slot that scrolls follows the new text, unless it was scrolled up to read.
      const following = slot.scrollHeight - slot.scrollTop - slot.clientHeight < 8;
      const tail = slot.querySelector(`:scope > .live-slot-${{name}}-tail`);
      if (tail) tail.insertAdjacentHTML('beforebegin', markup);
      else slot.insertAdjacentHTML('beforeend', markup);
      if (following && slot.scrollHeight > slot.clientHeight) slot.scrollTop = slot.scrollHeight;
    }}
  }};
  const close = () => {{ if (source) source.close(); source = null; }};
  source.addEventListener('done', close);
  source.onerror = close;
}};
new MutationObserver(connect).observe(element, {{childList: true, subtree: true, attributes: true}});
connect();
"""


# Gradio 6's status tracker keeps a timer loop of one callback per animation frame running
# even on an idle page (every animation frame, in a software-rendered browser taken from
# the decoding), and each of its frames restyles and lays out the whole page (the
# browser's main thread, and its compositor); a frame it
# asks for also starts Svelte's shared animation loop, which then asks for the next frame
# itself. The app hides every progress display, so neither is ever seen: a frame asked for
# by the tracker, or from inside a frame it asked for, is let through once a minute
# (twice a second already cost `none` a visible share of its rate, docs/app-cost.md); every other
# caller keeps every frame.
# It must run before Gradio's modules take their reference to requestAnimationFrame, so
# it goes first in the page's <head> (``HeadScript``), not in Gradio's own ``head``.
TRACKER_FRAME_MS = 60_000
PAGE_SCRIPT = (
    b"""<script>
(() => {
  const TRACKER_FRAME_MS = %d;
  const frame = window.requestAnimationFrame.bind(window);
  let inTracker = false;
  const tracked = (callback) => (time) => {
    inTracker = true;
    try { callback(time); } finally { inTracker = false; }
  };
  window.requestAnimationFrame = (callback) => {
    if (inTracker || (new Error().stack || "").includes("statustracker")) {
      return setTimeout(() => frame(tracked(callback)), TRACKER_FRAME_MS);
    }
    return frame(callback);
  };
})();
</script>"""
    % TRACKER_FRAME_MS
)
# Escape stops the answer from anywhere in the page, as in other chat apps. In a narrow
# window the chat list folds away (it starts open, over the chat), and folds again once a
# chat is picked.
KEYS_SCRIPT = rb"""<script>
document.addEventListener('keydown', (event) => {
  if (event.key === 'Escape') document.querySelector('#stop')?.click();
});
(() => {
  const narrow = () => window.innerWidth < 760;
  const fold = () => {
    const bar = document.querySelector('#sidebar.open');
    if (bar && narrow()) bar.querySelector('.toggle-button')?.click();
  };
  const first = new MutationObserver(() => {
    if (document.querySelector('#sidebar')) { first.disconnect(); setTimeout(fold, 0); }
  });
  first.observe(document.documentElement, {childList: true, subtree: true});
  document.addEventListener('click', (event) => {
    if (event.target.closest('#chats label, #new-chat')) setTimeout(fold, 300);
  });
})();
// An answer coloured by provenance is markup in the chat, with its Markdown kept, hidden,
// at its end: its copy buttons copy that Markdown, as they copy a plain answer's.
(() => {
  const clipboard = navigator.clipboard;
  if (!clipboard || !clipboard.writeText) return;
  const write = clipboard.writeText.bind(clipboard);
  const text = (markup) => {
    const box = document.createElement('textarea');
    box.innerHTML = markup.replace(/<[^>]+>/g, '');
    return box.value;
  };
  clipboard.writeText = (value) => write(typeof value === 'string'
    ? value.replace(/<div class="prov-answer">[\s\S]*?<div class="prov-source" hidden>([^<]*)<\/div><\/div>/g,
      (_, source) => text(source))
    : value);
})();
</script>"""
# The provenance colours (classes: the chat's sanitizer keeps them); a streamed answer's
# rendered blocks laid out as Markdown in its slot, which keeps plain text's spaces; and a
# narrow window's layout: the gauge column goes under the chat instead of squeezing it.
PAGE_STYLE = (
    "<style>\n"
    + provenance_css()
    + "\n.live-slot-answer > * {white-space:normal}"
    + "\n@media (max-width: 760px) { #gauge-column {min-width: 100% !important} }\n</style>"
).encode()
# Files and branches: the "Branch from here" buttons, drops on the message box, their styles.
PAGE_HEAD = PAGE_SCRIPT + KEYS_SCRIPT + PAGE_STYLE + FILES_HEAD.encode()


class HeadScript:
    """ASGI middleware: puts ``PAGE_HEAD`` (``PAGE_SCRIPT`` first) in the <head> of every HTML page the
    app serves (the app's own page is small and sent whole)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET":
            return await self.app(scope, receive, send)
        start: dict | None = None
        body = bytearray()

        async def capture(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if not headers.get(b"content-type", b"").startswith(b"text/html"):
                    start = None
                    return await send(message)
                start = message
                return None
            if start is None:
                return await send(message)
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return None
            page = bytes(body).replace(b"<head>", b"<head>" + PAGE_HEAD, 1)
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(page)).encode()))
            await send({**start, "headers": headers})
            return await send({"type": "http.response.body", "body": page})

        return await self.app(scope, receive, capture)


def live_slot(name: str, markup: str, style: str = "") -> str:
    """A panel's content as a slot the live feed writes into. Marked by a class: the
    chat's and Markdown's sanitizer keeps classes, and drops data attributes."""
    # Contained: a slot's new content is laid out and painted alone, not the whole page.
    return f'<div class="live-slot-{name}" style="contain:content;{style}">{markup}</div>'


def answer_slot(text: str = "") -> str:
    """The answer's bubble while it streams: plain text, its indentation kept, or (the
    colouring on) its rendered blocks, which the page lays out as Markdown."""
    return live_slot("answer", html.escape(text) or "…", "white-space:pre-wrap")


def feed_tag(feed_id: str) -> str:
    """What the live panel holds while an answer runs: the name of its feed."""
    return f'<div data-feed="{feed_id}"></div>'


@dataclass
class Feed:
    """One answer as the page sees it while it runs; its thread fills ``run``."""

    run: AnswerRun
    colour: bool
    waiting: bool = True  # queued behind another answer
    finished: bool = False
    shown: int = 0  # bumped when the page's panels were redrawn whole (the colouring toggle)

    def version(self) -> tuple:
        return (self.run.tokens, len(self.run.steps), self.waiting, self.finished, self.shown, self.colour)


class FeedReader:
    """What one page connection was sent of a feed, so that each message carries only
    what changed: new text is appended (the browser lays out and paints only the new
    lines); the small panels (legend, gauge, stats) are replaced, at most every
    ``panels_s`` and once at the end.

    A coloured answer is sent as its rendered Markdown, by blocks: a block is appended
    once it is closed (no later text changes it); the open last block is rendered again
    with each new text and replaced in its own slot. Rendering starts at the open block,
    so a message costs the open block and the new text, not the whole answer."""

    def __init__(self, feed: Feed, panels_s: float = SMOOTH.panels_s):
        self.feed = feed
        self.panels_s = panels_s
        self._position: tuple[int, int] | None = None  # (run, offset) sent; None: nothing yet
        self._shown = feed.shown
        self._panels_at = float("-inf")
        self._open_at = 0  # where the coloured answer's open block starts in its text
        self._closed = False  # the finished answer's last block was sent closed

    def message(self, now: float) -> dict[str, dict[str, str]]:
        feed = self.feed
        if feed.waiting and not feed.finished:
            return {"replace": {"stats": WAITING_HTML}}
        message: dict[str, dict[str, str]] = {"replace": {}, "append": {}}
        pieces = [(text, source) for text, source in feed.run.runs]
        restart = self._position is None or self._shown != feed.shown
        if restart:
            self._shown, new = feed.shown, pieces
            message["replace"]["answer"] = ""
        else:
            new = _since(pieces, self._position)
        if pieces:
            self._position = (len(pieces) - 1, len(pieces[-1][0]))
        elif self._position is None:
            self._position = (0, 0)
        grown = any(text for text, _ in new)
        # In its chat bubble: coloured by provenance, or plain, as the toggle says.
        if feed.colour and (restart or grown or (feed.finished and not self._closed)):
            self._coloured(message, pieces, restart)
        elif grown and not feed.colour:
            message["append"]["answer"] = provenance_pieces(new, False)
        if feed.finished or now - self._panels_at >= self.panels_s:
            self._panels_at = now
            message["replace"].update(
                legend=provenance_legend(feed.run, feed.colour),
                gauge=gauge_html(feed.run),
                stats=live_stats_html(feed.run),
            )
        return message

    def _coloured(self, message: dict[str, dict[str, str]], pieces: list[tuple[str, str]], restart: bool):
        if restart:
            self._open_at = 0
        blocks = render_blocks(Answer.of(pieces), self._open_at, self.feed.finished, PROVENANCE_LABELS)
        self._open_at, self._closed = blocks.open_at, self.feed.finished
        closed = "".join(blocks.closed)
        if restart:
            # The whole answer so far, after the placeholder is cleared: its tail slot last.
            message["append"]["answer"] = closed + live_slot("answer-tail", blocks.open)
            return
        if closed:
            message["append"]["answer"] = closed
        message["replace"]["answer-tail"] = blocks.open


def _since(pieces: list[tuple[str, str]], position: tuple[int, int]) -> list[tuple[str, str]]:
    """The runs of text after ``position`` (a run index and an offset in that run)."""
    index, offset = position
    if index >= len(pieces):
        return []
    return [(pieces[index][0][offset:], pieces[index][1]), *pieces[index + 1 :]]


class LiveFeeds:
    """The feeds of one app's recent answers, by unguessable id; the oldest are dropped.
    ``pace``: how often a connected page is sent what changed."""

    def __init__(self, kept: int = KEPT_FEEDS, pace: Pace = SMOOTH):
        self._kept = kept
        self.pace = pace
        self._feeds: OrderedDict[str, Feed] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, feed: Feed) -> str:
        feed_id = secrets.token_urlsafe(12)
        with self._lock:
            self._feeds[feed_id] = feed
            while len(self._feeds) > self._kept:
                self._feeds.popitem(last=False)
        return feed_id

    def get(self, feed_id: str) -> Feed | None:
        with self._lock:
            return self._feeds.get(feed_id)

    def router(self) -> APIRouter:
        """The route the page reads feeds from; mount it on the app that serves the UI."""
        router = APIRouter()

        @router.get(f"/{LIVE_PATH}/{{feed_id}}", include_in_schema=False)
        async def live(feed_id: str):
            feed = self.get(feed_id)
            if feed is None:
                return JSONResponse({"error": f"no live answer {feed_id!r}"}, status_code=404)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            events = _events(feed, self.pace)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)

        return router


async def _events(feed: Feed, pace: Pace) -> AsyncIterator[str]:
    reader, sent = FeedReader(feed, pace.panels_s), None
    loop = asyncio.get_running_loop()
    while True:
        version = feed.version()
        if version != sent:
            sent = version
            yield f"data: {json.dumps(reader.message(loop.time()))}\n\n"
        if feed.finished:
            yield "event: done\ndata: {}\n\n"
            return
        await asyncio.sleep(pace.text_s)


def pace_for(lm: EdgeSpec | None) -> Pace:
    """``SPARING`` where the target decodes on the CPU with a thread on every core."""
    if lm is None:
        return SMOOTH
    on_cpu = all(name.startswith("CPU") for name in lm.target.buffers)
    threads = lm.target.options.n_threads or default_threads()
    return SPARING if on_cpu and threads >= default_threads() else SMOOTH
