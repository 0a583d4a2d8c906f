"""The server's metrics, without a model: exact counts after a known sequence of calls,
read back through a strict reader of Prometheus' text format 0.0.4 (``prometheus_client``
is not a dependency), and the middleware that counts requests on a small app."""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.testclient import TestClient

from edgespec.decoding.events import Done, Stats
from edgespec.server.metrics import OTHER, TTFT_BUCKETS, Metrics, format_value, track_requests

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
VALUE = re.compile(r"[+-]?(?:Inf|NaN|\d+(?:\.\d+)?(?:e[+-]?\d+)?|\.\d+)")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass
class Family:
    name: str
    help: str
    type: str = ""
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def value(self, **labels: str) -> float:
        found = [v for name, got, v in self.samples if got == labels and name == self.name]
        assert len(found) == 1, f"{self.name}{labels}: {self.samples}"
        return found[0]


def _labels(text: str, line: str) -> tuple[dict[str, str], str]:
    """Parse ``{a="x",b="y"}`` at the start of ``text``; return the labels and the rest."""
    labels: dict[str, str] = {}
    i = 1
    while text[i] != "}":
        match = LABEL_NAME.match(text, i)
        assert match and text[match.end() : match.end() + 2] == '="', f"bad label in {line!r}"
        name, i = match.group(), match.end() + 2
        value = []
        while text[i] != '"':
            if text[i] == "\\":
                assert text[i + 1] in ESCAPES, f"bad escape in {line!r}"
                value.append(ESCAPES[text[i + 1]])
                i += 2
            else:
                assert text[i] != "\n"
                value.append(text[i])
                i += 1
        assert name not in labels, f"label {name} twice in {line!r}"
        labels[name] = "".join(value)
        i += 1
        if text[i] == ",":
            i += 1
    return labels, text[i + 1 :]


def parse_exposition(text: str) -> dict[str, Family]:
    """Prometheus' text format, read strictly: every family announced by HELP then TYPE
    before its samples, once; samples only under the family announced last; names, label
    syntax and escapes, and numbers as the format defines them."""
    assert text.endswith("\n") and "\n\n" not in text
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            assert NAME.fullmatch(name) and name not in families, line
            current = families[name] = Family(name, help_text)
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            assert current is not None and name == current.name and not current.type and kind in TYPES, line
            current.type = kind
        else:
            assert current is not None and current.type, f"sample before its family: {line!r}"
            current.samples.append(_sample(line, current))
    for family in families.values():
        _check_family(family)
    return families


def _sample(line: str, family: Family) -> tuple[str, dict[str, str], float]:
    match = NAME.match(line)
    assert match, line
    name, rest = match.group(), line[match.end() :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        labels, rest = _labels(rest, line)
    assert rest.startswith(" ") and VALUE.fullmatch(rest[1:]), f"bad value in {line!r}"
    suffixes = ("_bucket", "_sum", "_count") if family.type == "histogram" else ("",)
    assert name in {family.name + suffix for suffix in suffixes}, f"{name} under {family.name}"
    return name, labels, float(rest[1:].replace("Inf", "inf"))


def _check_family(family: Family) -> None:
    if family.type == "counter":
        assert family.name.endswith("_total"), family.name
        assert all(value >= 0 for _, _, value in family.samples)
    if family.type == "histogram":
        buckets = [
            (labels["le"], value) for name, labels, value in family.samples if name.endswith("_bucket")
        ]
        counts = [value for _, value in buckets]
        assert counts == sorted(counts), "buckets are cumulative"
        assert buckets[-1][0] == "+Inf"
        count = [v for name, _, v in family.samples if name == family.name + "_count"]
        assert count == [counts[-1]]


def _done(stop: str, tokens: int, prompt: int, reused: int, ttft: float, wall: float) -> Done:
    stats = Stats(tokens=tokens, prompt_tokens=prompt, reused_tokens=reused, ttft_s=ttft, wall_s=wall)
    return Done(text="", tail="", stop_reason=stop, stats=stats)


def _spec(**drafters: tuple[int, int, int]) -> dict:
    return {
        "drafters": {
            name: {"steps": steps, "drafted": drafted, "accepted": accepted}
            for name, (steps, drafted, accepted) in drafters.items()
        }
    }


@pytest.fixture
def metrics() -> Metrics:
    """Three answers and four requests, one still running."""
    m = Metrics()
    for status in (200, 200, 400):
        m.request_started("/v1/chat/completions")
        m.request_finished("/v1/chat/completions", status)
    m.request_started("/tokenize")
    m.answer(_done("eos", 10, 100, 40, 0.25, 1.25), _spec(ngram=(3, 12, 7), none=(2, 0, 0)))
    # No token: the whole time was the prompt's, and there is no first token to time.
    m.answer(_done("cancelled", 0, 8, 0, 0.0, 0.5), _spec())
    m.answer(_done("max_tokens", 5, 20, 16, 3.0, 4.0), _spec(draft=(2, 8, 8), ngram=(1, 4, 0)))
    return m


def test_requests_by_endpoint_and_status(metrics: Metrics) -> None:
    families = parse_exposition(metrics.render(1, 4, 2))
    requests = families["edgespec_requests_total"]
    assert requests.type == "counter"
    assert requests.value(endpoint="/v1/chat/completions", status="200") == 2
    assert requests.value(endpoint="/v1/chat/completions", status="400") == 1
    assert len(requests.samples) == 2  # the running one is not counted yet
    in_flight = families["edgespec_requests_in_flight"]
    assert in_flight.value(endpoint="/tokenize") == 1
    assert in_flight.value(endpoint="/v1/chat/completions") == 0


def test_answer_counters(metrics: Metrics) -> None:
    families = parse_exposition(metrics.render(1, 4, 2))

    def value(name: str, **labels: str) -> float:
        return families[name].value(**labels)

    assert value("edgespec_prompt_tokens_total") == 60 + 8 + 4
    assert value("edgespec_prompt_tokens_cached_total") == 40 + 0 + 16
    assert value("edgespec_generated_tokens_total") == 15
    assert value("edgespec_prompt_seconds_total") == 0.25 + 0.5 + 3.0
    assert value("edgespec_generation_seconds_total") == 1.0 + 0.0 + 1.0
    for reason in ("eos", "cancelled", "max_tokens"):
        assert value("edgespec_answers_total", stop_reason=reason) == 1


def test_draft_tokens_per_drafter(metrics: Metrics) -> None:
    families = parse_exposition(metrics.render(1, 4, 2))
    expected = {"ngram": (4, 16, 7), "none": (2, 0, 0), "draft": (2, 8, 8)}
    for drafter, (steps, drafted, accepted) in expected.items():
        assert families["edgespec_draft_steps_total"].value(drafter=drafter) == steps
        assert families["edgespec_draft_tokens_total"].value(drafter=drafter) == drafted
        assert families["edgespec_draft_tokens_accepted_total"].value(drafter=drafter) == accepted
    assert len(families["edgespec_draft_tokens_total"].samples) == 3


def test_time_to_first_token_histogram(metrics: Metrics) -> None:
    ttft = parse_exposition(metrics.render(1, 4, 2))["edgespec_time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    buckets = {labels["le"]: v for name, labels, v in ttft.samples if name.endswith("_bucket")}
    assert list(buckets) == [format_value(float(b)) for b in TTFT_BUCKETS] + ["+Inf"]
    # Observed: 0.25 (in its own bucket: le is inclusive) and 3.0.
    expected = [0, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    assert list(buckets.values()) == expected
    assert list(buckets) == ["0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "60.0", "+Inf"]
    sums = {name: v for name, _, v in ttft.samples if not name.endswith("_bucket")}
    assert sums == {ttft.name + "_sum": 3.25, ttft.name + "_count": 2}


def test_gauges_and_llama_server_aliases(metrics: Metrics) -> None:
    families = parse_exposition(metrics.render(1, 4, 2))
    assert families["edgespec_slots_busy"].value() == 1
    assert families["edgespec_slots_capacity"].value() == 4
    assert families["edgespec_requests_waiting"].value() == 2
    assert all(
        families[name].type == "gauge" for name in ("edgespec_slots_busy", "edgespec_requests_waiting")
    )
    assert families["llamacpp:prompt_tokens_total"].value() == 72
    assert families["llamacpp:prompt_seconds_total"].value() == 3.75
    assert families["llamacpp:tokens_predicted_total"].value() == 15
    assert families["llamacpp:tokens_predicted_seconds_total"].value() == 2.0
    assert families["llamacpp:prompt_tokens_seconds"].value() == pytest.approx(72 / 3.75)
    assert families["llamacpp:predicted_tokens_seconds"].value() == pytest.approx(7.5)
    assert families["llamacpp:requests_processing"].value() == 1
    assert families["llamacpp:requests_deferred"].value() == 2


def test_every_edgespec_name_is_prefixed_and_counters_end_total(metrics: Metrics) -> None:
    families = parse_exposition(metrics.render(0, 1, 0))
    for name, family in families.items():
        assert name.startswith(("edgespec_", "llamacpp:")), name
        assert (family.type == "counter") == name.endswith("_total"), name


def test_fresh_metrics_render_zeros() -> None:
    families = parse_exposition(Metrics().render(0, 0, 0))
    assert families["edgespec_requests_total"].samples == []  # announced, nothing yet
    assert families["edgespec_generated_tokens_total"].value() == 0
    assert families["llamacpp:predicted_tokens_seconds"].value() == 0
    ttft = families["edgespec_time_to_first_token_seconds"]
    assert {v for _, _, v in ttft.samples} == {0}


def test_label_values_are_escaped() -> None:
    m = Metrics()
    weird = 'a "quoted" back\\slash\nnewline'
    m.request_started(weird)
    m.request_finished(weird, 200)
    m.answer(_done("eos", 2, 3, 0, 0.1, 0.2), _spec(**{'dr"aft\\er': (1, 2, 1)}))
    text = m.render(0, 1, 0)
    assert 'endpoint="a \\"quoted\\" back\\\\slash\\nnewline"' in text
    families = parse_exposition(text)
    assert families["edgespec_requests_total"].value(endpoint=weird, status="200") == 1
    assert families["edgespec_draft_tokens_total"].value(drafter='dr"aft\\er') == 2


def test_format_value() -> None:
    assert format_value(3) == "3"
    assert format_value(0.5) == "0.5"
    assert format_value(1.0) == "1.0"
    assert format_value(math.inf) == "+Inf"
    assert format_value(-math.inf) == "-Inf"
    assert format_value(math.nan) == "NaN"


def test_counters_are_thread_safe() -> None:
    m = Metrics()
    per_thread, threads = 2000, 8

    def hammer() -> None:
        for _ in range(per_thread):
            m.request_started("/x")
            m.request_finished("/x", 200)
            m.answer(_done("eos", 1, 2, 1, 0.5, 1.0), _spec(ngram=(1, 2, 1)))

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    families = parse_exposition(m.render(0, 1, 0))
    n = per_thread * threads
    assert families["edgespec_requests_total"].value(endpoint="/x", status="200") == n
    assert families["edgespec_requests_in_flight"].value(endpoint="/x") == 0
    assert families["edgespec_generated_tokens_total"].value() == n
    assert families["edgespec_draft_tokens_accepted_total"].value(drafter="ngram") == n


def _app(m: Metrics) -> FastAPI:
    app = FastAPI()
    track_requests(app, m)

    @app.exception_handler(Exception)
    async def unexpected(_request, _exc) -> JSONResponse:
        return JSONResponse({"error": "internal"}, status_code=500)

    @app.get("/a")
    async def a() -> dict:
        return {}

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("boom")

    @app.api_route("/v1/{rest:path}", methods=["GET"])
    async def fallback(rest: str) -> JSONResponse:
        return JSONResponse({}, status_code=404)

    return app


def test_middleware_counts_requests_under_their_route() -> None:
    m = Metrics()
    with TestClient(_app(m), raise_server_exceptions=False) as client:
        assert client.get("/a").status_code == 200
        assert client.get("/a").status_code == 200
        assert client.post("/a").status_code == 405  # the route's, though the method is wrong
        assert client.get("/boom").status_code == 500
        assert client.get("/v1/x").status_code == 404
        assert client.get("/v1/y/z").status_code == 404  # one label for every such path
        assert client.get("/nowhere").status_code == 404
    requests = parse_exposition(m.render(0, 1, 0))["edgespec_requests_total"]
    assert requests.value(endpoint="/a", status="200") == 2
    assert requests.value(endpoint="/a", status="405") == 1
    assert requests.value(endpoint="/boom", status="500") == 1
    assert requests.value(endpoint="/v1/{rest:path}", status="404") == 2
    assert requests.value(endpoint=OTHER, status="404") == 1
    assert len(requests.samples) == 5
    in_flight = parse_exposition(m.render(0, 1, 0))["edgespec_requests_in_flight"]
    assert {v for _, _, v in in_flight.samples} == {0}


def test_prometheus_client_reads_the_same(metrics: Metrics) -> None:
    """Where ``prometheus_client`` is installed, its parser reads what ours reads."""
    parser = pytest.importorskip("prometheus_client.parser")
    text = metrics.render(1, 4, 2)
    ours = {
        (name, tuple(sorted(labels.items())), value)
        for family in parse_exposition(text).values()
        for name, labels, value in family.samples
    }
    theirs = {
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert ours == theirs


def test_metrics_route_answers_while_loading() -> None:
    """/metrics needs no loaded pair (its slot gauges read 0 then), the key where there is
    one; the other extra routes say "loading"."""
    from edgespec.server.app import ServerState, create_app

    state = ServerState(api_key="k")
    app = create_app(state)
    key = {"Authorization": "Bearer k"}
    with TestClient(app) as client:
        assert client.get("/metrics").status_code == 401
        response = client.get("/metrics", headers=key)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        for path, method in [("/props", "GET"), ("/tokenize", "POST"), ("/v1/embeddings", "POST")]:
            refused = client.request(method, path, headers=key, json={})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_loading"
        families = parse_exposition(client.get("/metrics", headers=key).text)
    assert families["edgespec_slots_capacity"].value() == 0
    assert families["edgespec_requests_total"].value(endpoint="/metrics", status="401") == 1
    assert families["edgespec_requests_total"].value(endpoint="/metrics", status="200") == 1
    assert families["edgespec_requests_total"].value(endpoint="/props", status="503") == 1
    assert families["edgespec_requests_in_flight"].value(endpoint="/metrics") == 1  # this one


def test_cors_and_the_other_wire_formats_while_loading() -> None:
    """``--cors``: a browser's preflight from an allowed origin is answered, from another
    it is not. While loading, Messages refuses in Anthropic's shape, Responses in OpenAI's."""
    from edgespec.server.app import ServerState, create_app

    app = create_app(ServerState(), ["http://localhost:3000"])
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    with TestClient(app) as client:
        allowed = client.options(
            "/v1/chat/completions", headers={"Origin": "http://localhost:3000", **preflight}
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = client.options("/v1/chat/completions", headers={"Origin": "http://evil.test", **preflight})
        assert "access-control-allow-origin" not in other.headers
        body = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        messages = client.post("/v1/messages", json=body)
        assert messages.status_code == 503
        assert messages.json() == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "the model is still loading; try again shortly"},
        }
        responses = client.post("/v1/responses", json={"input": "hi"})
        assert responses.status_code == 503 and responses.json()["error"]["code"] == "model_loading"
    with TestClient(create_app(ServerState())) as client:
        plain = client.options(
            "/v1/chat/completions", headers={"Origin": "http://localhost:3000", **preflight}
        )
        assert "access-control-allow-origin" not in plain.headers
