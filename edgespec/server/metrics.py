"""The server's counters, served at ``/metrics`` in Prometheus' text format (0.0.4).

One ``Metrics`` lives as long as the server. Requests are counted by a middleware
(``track_requests``) under their route's path, so that a client asking for made-up paths
cannot grow the label set without bound; answers are counted when they finish (``answer``,
fed each answer's ``Done`` and its ``speculation`` summary from ``server.chunks``).

Names start ``edgespec_``; counters end ``_total``, durations are in seconds. The headline
figures are repeated under llama-server's names (``llamacpp:…``), so that a dashboard made
for llama-server reads edgespec unchanged:

* ``llamacpp:prompt_tokens_total``, ``llamacpp:prompt_seconds_total``: prompt tokens
  computed, and the time to the first token;
* ``llamacpp:tokens_predicted_total``, ``llamacpp:tokens_predicted_seconds_total``: tokens
  generated, and the time after the first token;
* ``llamacpp:prompt_tokens_seconds``, ``llamacpp:predicted_tokens_seconds``: the mean
  rates those make (0 before anything ran);
* ``llamacpp:requests_processing``, ``llamacpp:requests_deferred``: busy slots, and
  requests waiting for one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgespec.decoding.events import Done

# Time-to-first-token buckets, seconds: a short prompt on a fast machine to a long one on
# a slow CPU (a 30 k-token prefill takes minutes there).
TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"  # the endpoint label of a request no route matched


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """Integers without a point, floats as Python's shortest exact repr, infinities as the
    format spells them."""
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inside = ",".join(f'{name}="{escape_label(value)}"' for name, value in pairs)
    return f"{{{inside}}}" if inside else ""


@dataclass
class _Family:
    """One metric family being written: its header, then its samples."""

    name: str
    kind: str
    help: str
    lines: list[str] = field(default_factory=list)

    def sample(self, value: float, labels: Iterable[tuple[str, str]] = (), suffix: str = "") -> None:
        self.lines.append(f"{self.name}{suffix}{_labels(labels)} {format_value(value)}")

    def text(self) -> str:
        head = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        return "\n".join(head + self.lines)


@dataclass
class Histogram:
    """Observations counted into fixed buckets (each bucket counts values <= its bound)."""

    bounds: tuple[float, ...] = TTFT_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; +Inf last
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += 1
        self.total += value
        self.count += 1

    def write(self, family: _Family) -> None:
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            family.sample(running, [("le", format_value(float(bound)))], "_bucket")
        family.sample(self.total, suffix="_sum")
        family.sample(self.count, suffix="_count")


@dataclass
class _Drafted:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0


class Metrics:
    """Thread-safe counters for the server's life: requests by endpoint and status, and
    what the answers computed. ``render`` writes them in Prometheus' text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = {}
        self._in_flight: dict[str, int] = {}
        self._answers: dict[str, int] = {}
        self._prompt_computed = 0
        self._prompt_cached = 0
        self._generated = 0
        self._prompt_s = 0.0
        self._generation_s = 0.0
        self._ttft = Histogram()
        self._drafters: dict[str, _Drafted] = {}

    # -- recording ----------------------------------------------------------------------

    def request_started(self, endpoint: str) -> None:
        with self._lock:
            self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1

    def request_finished(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, int(status))
            self._requests[key] = self._requests.get(key, 0) + 1
            if self._in_flight.get(endpoint, 0) > 0:
                self._in_flight[endpoint] -= 1

    def answer(self, done: Done, speculation: dict[str, Any]) -> None:
        """One finished answer: its ``Done`` and the ``speculation`` object its body
        carried (``chunks.Speculation.as_dict``)."""
        s = done.stats
        # As ``chunks.timings``: the first token closes the prompt phase; an answer with no
        # token at all spent its whole time on the prompt, and has no first token to time.
        first_s = s.ttft_s if s.tokens else s.wall_s
        drafters = speculation.get("drafters") or {}
        with self._lock:
            reason = done.stop_reason or "unknown"
            self._answers[reason] = self._answers.get(reason, 0) + 1
            self._prompt_computed += max(0, s.prompt_tokens - s.reused_tokens)
            self._prompt_cached += s.reused_tokens
            self._generated += s.tokens
            self._prompt_s += first_s
            self._generation_s += max(0.0, s.wall_s - first_s)
            if s.tokens:
                self._ttft.observe(s.ttft_s)
            for name, totals in drafters.items():
                seen = self._drafters.setdefault(str(name), _Drafted())
                seen.steps += int(totals.get("steps", 0))
                seen.drafted += int(totals.get("drafted", 0))
                seen.accepted += int(totals.get("accepted", 0))

    # -- exposition ---------------------------------------------------------------------

    def render(self, slots_busy: int, slots_total: int, waiting: int) -> str:
        """Every metric in the text format, the server's gauges read now (``slots_busy``,
        ``slots_total``, ``waiting``) beside the counters."""
        with self._lock:
            families = [
                *self._request_families(),
                *self._token_families(),
                *self._draft_families(),
                *_gauges(slots_busy, slots_total, waiting),
                *self._aliases(slots_busy, waiting),
            ]
        return "\n".join(family.text() for family in families) + "\n"

    def _request_families(self) -> list[_Family]:
        requests = _Family(
            "edgespec_requests_total", "counter", "HTTP requests answered, by endpoint and status."
        )
        for (endpoint, status), n in sorted(self._requests.items()):
            requests.sample(n, [("endpoint", endpoint), ("status", str(status))])
        in_flight = _Family("edgespec_requests_in_flight", "gauge", "HTTP requests being answered now.")
        for endpoint, n in sorted(self._in_flight.items()):
            in_flight.sample(n, [("endpoint", endpoint)])
        answers = _Family("edgespec_answers_total", "counter", "Answers finished, by why they stopped.")
        for reason, n in sorted(self._answers.items()):
            answers.sample(n, [("stop_reason", reason)])
        return [requests, in_flight, answers]

    def _token_families(self) -> list[_Family]:
        ttft = _Family(
            "edgespec_time_to_first_token_seconds",
            "histogram",
            "Seconds from an answer's start to its first token.",
        )
        self._ttft.write(ttft)
        return [
            _single(
                "edgespec_prompt_tokens_total", "counter", "Prompt tokens computed.", self._prompt_computed
            ),
            _single(
                "edgespec_prompt_tokens_cached_total",
                "counter",
                "Prompt tokens found in a cache, not computed again.",
                self._prompt_cached,
            ),
            _single("edgespec_generated_tokens_total", "counter", "Tokens generated.", self._generated),
            _single(
                "edgespec_prompt_seconds_total",
                "counter",
                "Seconds spent before answers' first tokens.",
                self._prompt_s,
            ),
            _single(
                "edgespec_generation_seconds_total",
                "counter",
                "Seconds spent generating after answers' first tokens.",
                self._generation_s,
            ),
            ttft,
        ]

    def _draft_families(self) -> list[_Family]:
        steps = _Family(
            "edgespec_draft_steps_total", "counter", "Target passes, by the drafter that ran before each."
        )
        drafted = _Family("edgespec_draft_tokens_total", "counter", "Draft tokens proposed, by drafter.")
        accepted = _Family(
            "edgespec_draft_tokens_accepted_total", "counter", "Draft tokens accepted, by drafter."
        )
        for name, seen in sorted(self._drafters.items()):
            label = [("drafter", name)]
            steps.sample(seen.steps, label)
            drafted.sample(seen.drafted, label)
            accepted.sample(seen.accepted, label)
        return [steps, drafted, accepted]

    def _aliases(self, slots_busy: int, waiting: int) -> list[_Family]:
        return [
            _single(
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                self._prompt_computed,
            ),
            _single("llamacpp:prompt_seconds_total", "counter", "Prompt process time", self._prompt_s),
            _single(
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                self._generated,
            ),
            _single(
                "llamacpp:tokens_predicted_seconds_total",
                "counter",
                "Predict process time",
                self._generation_s,
            ),
            _single(
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                _rate(self._prompt_computed, self._prompt_s),
            ),
            _single(
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                _rate(self._generated, self._generation_s),
            ),
            _single("llamacpp:requests_processing", "gauge", "Number of requests processing.", slots_busy),
            _single("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", waiting),
        ]


def _single(name: str, kind: str, help: str, value: float) -> _Family:
    family = _Family(name, kind, help)
    family.sample(value)
    return family


def _gauges(slots_busy: int, slots_total: int, waiting: int) -> list[_Family]:
    return [
        _single("edgespec_slots_busy", "gauge", "Slots decoding an answer now.", slots_busy),
        _single("edgespec_slots_capacity", "gauge", "Slots: answers that can decode at once.", slots_total),
        _single("edgespec_requests_waiting", "gauge", "Requests waiting for a slot.", waiting),
    ]


def _rate(count: float, seconds: float) -> float:
    return count / seconds if count > 0 and seconds > 0 else 0.0


# -- counting requests --------------------------------------------------------------------


def endpoint_of(routes: Iterable[Any], scope: Scope) -> str:
    """The path of the route a request goes to ("/v1/chat/completions"), its template
    where it has parameters ("/v1/{rest:path}"), "<mount>/*" inside a mounted app (the chat
    app), else ``OTHER``. A route that matches the path only (the wrong method) still
    names the endpoint: the 405 belongs to it."""
    partial = None
    for route in routes:
        match, _child = route.matches(scope)
        if match is Match.FULL:
            return _route_name(route)
        if match is Match.PARTIAL and partial is None:
            partial = route
    return _route_name(partial) if partial is not None else OTHER


def _route_name(route: Any) -> str:
    if isinstance(route, Mount):  # its path is a prefix ("" at the root)
        return f"{route.path}/*"
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else OTHER


class RequestMetrics:
    """ASGI middleware counting every HTTP request under its endpoint and final status
    (a request that raised is a 500: the app's error handler answers it outside)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Callable[[], Iterable[Any]]):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = endpoint_of(self.routes(), scope)
        status = 500  # unless a response starts

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        self.metrics.request_started(endpoint)
        try:
            await self.app(scope, receive, watch)
        finally:
            self.metrics.request_finished(endpoint, status)


def track_requests(app: Any, metrics: Metrics) -> None:
    """Count ``app``'s requests in ``metrics`` (call before the app serves). Routes are read
    at each request, so those added after this call are named too."""
    app.add_middleware(RequestMetrics, metrics=metrics, routes=lambda: app.router.routes)
