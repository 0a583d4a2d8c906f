"""The sessions benchmark without a model: its workloads, its stream parser and client
against a real HTTP server on loopback (in a thread, or started as a process the way the
benchmark starts ``edgespec serve``), its runner and its summary.

The fake server speaks OpenAI's streaming chat completions: a role chunk at once, then the
content after ``delay`` seconds, a finish chunk, a usage chunk (or, as llama-server may,
``timings`` alone), ``[DONE]``, in HTTP/1.1 chunked transfer encoding as uvicorn sends it.
Its cached tokens are the longest message prefix it has seen before (10 tokens a message),
so a restart empties them. Run as a script it serves on the port given.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edgespec.bench import session_workloads as sw
from edgespec.bench.session_servers import (
    PORT,
    Endpoint,
    Server,
    Settings,
    Target,
    api_url,
    chat,
    edgespec_command,
    first_model,
    llama_server_command,
    read_reply,
    sse_data,
    token_counts,
)
from edgespec.bench.sessions import (
    Record,
    WorkloadRun,
    cached_share,
    markdown,
    median,
    ratio,
    run_all,
    run_workload,
    summarize,
    url_target,
)
from edgespec.cli.main import main as cli_main
from edgespec.errors import EdgespecError

# ---------------------------------------------------------------- the fake server


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0, *, delay: float = 0.0, style: str = "openai", status: int = 200):
        super().__init__(("127.0.0.1", port), Handler)
        self.delay, self.style, self.status = delay, style, status
        self.requests: list[dict] = []
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.active = self.most_active = 0

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up mid-stream (the failure tests do): nothing to report

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _event(self, data: dict | str) -> None:
        payload = data if isinstance(data, str) else json.dumps(data)
        raw = f"data: {payload}\n\n".encode()
        self.wfile.write(f"{len(raw):X}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake-target"}, {"id": "fake-draft"}]})
        else:
            self._json(404, {"error": {"message": f"no such path {self.path}"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append(body)
            server.active += 1
            server.most_active = max(server.most_active, server.active)
            messages = body["messages"]
            prefixes = [json.dumps(messages[:k]) for k in range(1, len(messages) + 1)]
            cached = 10 * max([k for k, p in enumerate(prefixes, 1) if p in server.seen], default=0)
            server.seen.update(prefixes)
        self.left = False
        try:
            self._answer(body, 10 * len(messages), cached)
        finally:
            self._leave()

    def _leave(self) -> None:
        """The request no longer counts as active: called before its last bytes, which
        let the client send its next request (counted after this one, however slowly this
        thread winds down on a busy machine)."""
        if not self.left:
            self.left = True
            with self.server.lock:
                self.server.active -= 1

    def _answer(self, body: dict, prompt: int, cached: int) -> None:
        server = self.server
        if server.status != 200:
            self._json(server.status, {"error": {"message": "the model is busy", "type": "server_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "c1", "object": "chat.completion.chunk", "model": body["model"]}
        self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        time.sleep(server.delay)
        if server.style == "broken":
            self._event({"error": {"message": "the engine failed"}})
        words = [f"answer{len(body['messages'])}", " to", " you"]
        for word in words:
            self._event({**base, "choices": [{"index": 0, "delta": {"content": word}}]})
        self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        timings = {"cache_n": cached, "prompt_n": prompt - cached, "predicted_n": len(words)}
        if server.style == "timings":
            self._event({**base, "choices": [], "timings": timings})
        else:
            usage = {"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + 3,
                     "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
            self._event({**base, "choices": [], "usage": usage, "timings": timings})
        self._leave()
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def start(**kwargs) -> FakeServer:
        server = FakeServer(**kwargs)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def endpoint(server: FakeServer) -> Endpoint:
    return Endpoint("fake", server.url, model="fake-target")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SETTINGS = Settings(max_tokens=8, threads=1, startup_timeout_s=30, request_timeout_s=30)
FAKE_COMMAND = (sys.executable, str(Path(__file__).resolve()), PORT)  # this file, run as a server

# ---------------------------------------------------------------- workloads


def test_workloads_are_deterministic_and_have_both_splits():
    first, again = sw.load_workloads("all"), sw.load_workloads("all")
    assert first == again
    for kind in sw.WORKLOADS:
        splits = sorted(w.split for w in first if w.kind == kind)
        assert splits == ["dev", "test"], kind
    assert [w.split for w in sw.load_workloads("dev")] == ["dev"] * len(sw.WORKLOADS)
    assert [w.kind for w in sw.load_workloads("test", ["agent"])] == ["agent"]


def test_dev_and_test_differ():
    dev, test = sw.load_workloads("dev"), sw.load_workloads("test")
    for d, t in zip(dev, test, strict=True):
        assert d.kind == t.kind
        dev_turns = {turn for c in d.conversations for turn in c.turns}
        test_turns = {turn for c in t.conversations for turn in c.turns}
        assert not dev_turns & test_turns, d.kind


def test_workload_shapes():
    by_id = {w.id: w for w in sw.load_workloads("all")}
    alternating = by_id["alternating-test"]
    assert 2 <= len(alternating.conversations) <= 4
    assert all(len(c.turns) == 4 for c in alternating.conversations)  # an opening and 3 follow-ups
    assert all(len(c.turns[0]) > 7000 and max(map(len, c.turns[1:])) < 300 for c in alternating.conversations)
    assert 5 <= len(by_id["agent-test"].conversations[0].turns) <= 6
    assert by_id["agent+chat-test"].concurrent and not alternating.concurrent
    assert by_id["restart-test"].restart_after == 2 and alternating.restart_after is None
    # Every ${name} was filled in, and a question names a function its opening file defines.
    turns = [t for w in by_id.values() for c in w.conversations for t in c.turns]
    assert not any("${" in t for t in turns)
    opening, question = alternating.conversations[0].turns[:2]
    name = question.split("`")[1]
    assert f"def {name}(" in opening


@pytest.mark.parametrize(
    ("kind", "tokens"),  # a Python file holds at least a class and two functions: 400 tokens
    [("python", 450), ("python", 2000), ("log", 250), ("log", 2000), ("grep", 300), ("grep", 2000)],
)
def test_generated_files_are_about_the_size_asked(kind: str, tokens: int):
    data = sw.tomllib.loads(sw.DATA_FILE.read_text())
    lib = {**data["vocabulary"], **data["templates"]}
    for seed in range(5):
        text, names = sw.GENERATORS[kind](random.Random(seed), lib, tokens * sw.CHARS_PER_TOKEN)
        assert abs(len(text) / sw.CHARS_PER_TOKEN - tokens) <= 0.1 * tokens + 60, (seed, len(text))
        assert names
    if kind == "python":
        compile(text, "generated.py", "exec")  # realistic enough to be valid Python


def test_a_bad_data_file_is_one_line(tmp_path: Path):
    text = sw.DATA_FILE.read_text().replace("What does `${func}` return?", "What does `${nothing}` return?")
    bad = tmp_path / "sessions.toml"
    bad.write_text(text)
    with pytest.raises(EdgespecError, match=r"alternating-dev.*nothing"):
        sw.load_workloads("all", path=bad)
    with pytest.raises(EdgespecError, match="cannot read"):
        sw.load_workloads(path=tmp_path / "missing.toml")


# ---------------------------------------------------------------- the stream and the client


def test_sse_data():
    lines = [b": a comment\r\n", b"event: message\n", b"data: {\"a\": 1}\n", b"\n", "data: one\n",
             "data:two\n", "\n", "\n", "data: [DONE]\n", "\n", "data: after\n", "\n"]  # fmt: skip
    assert list(sse_data(lines)) == ['{"a": 1}', "one\ntwo"]
    assert list(sse_data(["data: last, unterminated"])) == ["last, unterminated"]


def test_token_counts_prefer_usage_then_timings():
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 60}}
    timings = {"cache_n": 50, "prompt_n": 40, "predicted_n": 6}
    assert token_counts(usage, timings) == {"prompt_tokens": 100, "cached_tokens": 60, "completion_tokens": 7,
                                            "cache_n": 50, "prompt_n": 40}  # fmt: skip
    only = token_counts(None, timings)
    assert (only["prompt_tokens"], only["cached_tokens"], only["completion_tokens"]) == (90, 50, 6)
    assert set(token_counts({}, None).values()) == {None}


def test_read_reply_times_the_first_content():
    clock = iter([1.5, 2.0]).__next__
    events = [json.dumps(e) for e in (
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {"content": " there"}}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    )]  # fmt: skip
    reply = read_reply(events, 1.0, clock)
    assert (reply.text, reply.ttft_s, reply.e2e_s, reply.prompt_tokens) == ("Hi there", 0.5, 1.0, 5)
    with pytest.raises(EdgespecError, match="not JSON"):
        read_reply(["{oops"], 0.0)


def test_chat_against_a_real_server(fake):
    server = fake(delay=0.2)
    messages = [{"role": "user", "content": "hello"}]
    reply = chat(endpoint(server), messages, max_tokens=8, timeout=10)
    assert reply.text == "answer1 to you"
    assert 0.2 <= reply.ttft_s <= reply.e2e_s  # the role chunk came at once but carried no content
    assert (reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens) == (10, 0, 3)
    sent = server.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert (sent["temperature"], sent["max_tokens"], sent["model"]) == (0, 8, "fake-target")
    longer = [*messages, {"role": "assistant", "content": reply.text}, {"role": "user", "content": "more"}]
    again = chat(endpoint(server), longer, max_tokens=8, timeout=10)
    assert (again.prompt_tokens, again.cached_tokens) == (30, 10)


def test_chat_reads_llama_server_timings(fake):
    reply = chat(
        endpoint(fake(style="timings")), [{"role": "user", "content": "hi"}], max_tokens=8, timeout=10
    )
    assert (reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens) == (10, 0, 3)
    assert (reply.cache_n, reply.prompt_n) == (0, 10)


def test_failures_are_one_line(fake):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(EdgespecError, match="HTTP 503: the model is busy"):
        chat(endpoint(fake(status=503)), messages, max_tokens=8, timeout=10)
    with pytest.raises(EdgespecError, match="error in the stream: the engine failed"):
        chat(endpoint(fake(style="broken")), messages, max_tokens=8, timeout=10)
    nobody = Endpoint("gone", f"http://127.0.0.1:{closed_port()}/v1", model="m")
    with pytest.raises(EdgespecError, match=r"gone: POST .*connection refused"):
        chat(nobody, messages, max_tokens=8, timeout=10)
    with pytest.raises(EdgespecError, match=r"gone: GET .*connection refused"):
        first_model(nobody)


def test_urls_and_labels(fake):
    assert api_url("http://127.0.0.1:8081") == "http://127.0.0.1:8081/v1"
    assert api_url("http://127.0.0.1:8081/v1/") == "http://127.0.0.1:8081/v1"
    with pytest.raises(EdgespecError, match="not an http"):
        api_url("127.0.0.1:8081")
    assert url_target("llama-server=http://127.0.0.1:8081/v1", 1) == Target(
        "llama-server", url="http://127.0.0.1:8081/v1"
    )
    assert url_target("http://127.0.0.1:8081/v1?x=1", 2).label == "127.0.0.1:8081"
    assert first_model(endpoint(fake())) == "fake-target"


def test_server_commands():
    settings = Settings(ctx=8192, threads=2)
    command = edgespec_command("default", "none", settings, "--cache-ram 2 --cache-dir '/tmp/a b'")
    assert command[:4] == (sys.executable, "-m", "edgespec", "serve")
    assert command[-4:] == ("--cache-ram", "2", "--cache-dir", "/tmp/a b")
    assert PORT in command and "8192" in command
    llama = llama_server_command(Path("/bin/llama-server"), Path("t.gguf"), Path("d.gguf"), settings, "-v")
    text = " ".join(llama)
    for part in ("-m t.gguf", "-md d.gguf", "-np 4", "-kvu", "--cache-ram 2048", "-c 32768", "-t 2",
                 f"--port {PORT}", "--host 127.0.0.1"):  # fmt: skip
        assert part in text
    assert "-md" not in llama_server_command(Path("s"), Path("t.gguf"), None, settings)
    with pytest.raises(EdgespecError, match="cannot split"):
        edgespec_command("default", "default", settings, "--x 'open")


# ---------------------------------------------------------------- running workloads


def test_agent_history_grows_with_each_answer(fake):
    server = fake()
    workload = next(w for w in sw.load_workloads("test") if w.kind == "agent")
    run = run_workload(workload, Target("fake", url=server.url), SETTINGS, 0, "t1")
    turns = len(workload.conversations[0].turns)
    assert [r.phase for r in run.records] == ["cold"] + ["returning"] * (turns - 1)
    assert [len(b["messages"]) for b in server.requests] == [2 + 2 * i for i in range(turns)]
    second = server.requests[1]["messages"]
    assert second[0]["content"].startswith("Session t1.\n")  # the run's tag opens the system prompt
    assert second[2] == {"role": "assistant", "content": "answer2 to you"}
    assert all(r.cached_tokens == r.prompt_tokens - 20 for r in run.records[1:])
    assert run.wall_s is not None and run.wall_s >= sum(r.e2e_s for r in run.records) * 0.99


def test_alternating_takes_turns(fake):
    server = fake()
    workload = next(w for w in sw.load_workloads("dev") if w.kind == "alternating")
    run = run_workload(workload, Target("fake", url=server.url), SETTINGS, 0, "t2")
    names = [c.name for c in workload.conversations]
    assert [r.conversation for r in run.records[: len(names)]] == names
    assert [r.turn for r in run.records] == [t for t in range(4) for _ in names]
    assert {r.phase for r in run.records[: len(names)]} == {"cold"}


def test_agent_and_chat_run_at_the_same_time(fake):
    server = fake(delay=0.1)
    workload = next(w for w in sw.load_workloads("test") if w.kind == "agent+chat")
    run = run_workload(workload, Target("fake", url=server.url), SETTINGS, 0, "t3")
    assert {r.conversation for r in run.records} == {"agent", "chat"}
    assert len(run.records) == sum(len(c.turns) for c in workload.conversations)
    assert server.most_active == 2


def test_a_failing_request_stops_both_clients(fake):
    workload = next(w for w in sw.load_workloads("test") if w.kind == "agent+chat")
    with pytest.raises(EdgespecError, match="HTTP 500"):
        run_workload(workload, Target("fake", url=fake(status=500).url), SETTINGS, 0, "t4")


def test_restart_is_skipped_against_a_url(fake):
    workload = next(w for w in sw.load_workloads("test") if w.kind == "restart")
    run = run_workload(workload, Target("fake", url=fake().url), SETTINGS, 0, "t5")
    assert run.records == [] and "skipped" in run.note and run.wall_s is None


def test_restart_on_a_started_server():
    """The benchmark starts this file as a server, restarts it in the middle and stops it:
    the first request of each conversation after the restart is ``resumed``, cold again
    for the new process."""
    workload = next(w for w in sw.load_workloads("test") if w.kind == "restart")
    run = run_workload(workload, Target("started", command=FAKE_COMMAND), SETTINGS, 0, "t6")
    phases = [r.phase for r in run.records]
    n = len(workload.conversations)
    assert phases == ["cold"] * n + ["returning"] * n + ["resumed"] * n + ["returning"] * n
    resumed = [r for r in run.records if r.phase == "resumed"]
    assert all(r.cached_tokens == 0 for r in resumed)
    assert all(r.cached_tokens > 0 for r in run.records if r.phase == "returning")
    assert run.restart_s > 0


def test_a_started_server_is_stopped_however_the_block_ends():
    target = Target("started", command=FAKE_COMMAND)
    with pytest.raises(KeyboardInterrupt), Server(target, SETTINGS) as server:
        process = server._process
        assert server.endpoint.model == "fake-target"
        raise KeyboardInterrupt
    assert process is not None and process.poll() is not None


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_killed_benchmark_leaves_no_server(tmp_path: Path):
    """A benchmark killed outright (no Ctrl-C, no cleanup) takes its started server along."""
    pid_file = tmp_path / "pid"
    server = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    target = f"Target('s', command=({sys.executable!r}, '-c', {server!r}))"
    bench = f"from edgespec.bench.session_servers import *\nServer({target}, Settings()).__enter__()"
    process = subprocess.Popen([sys.executable, "-c", bench])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    process.kill()
    process.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the started server {pid} outlived the benchmark")


def test_a_server_that_does_not_come_up_is_one_line():
    exits = Target("exits", command=(sys.executable, "-c", "import sys; print('no model'); sys.exit(3)"))
    with pytest.raises(EdgespecError, match="exits exited with code 3 before it was ready: no model"):
        Server(exits, SETTINGS).__enter__()
    sleeps = Target("sleeps", command=(sys.executable, "-c", "import time; time.sleep(60)"))
    started = time.monotonic()
    quick = Settings(startup_timeout_s=1.0)
    with pytest.raises(EdgespecError, match="sleeps was not ready within 1 s"):
        Server(sleeps, quick).__enter__()
    assert time.monotonic() - started < 20
    missing = Target("missing", command=("/nonexistent/llama-server", "--port", PORT))
    with pytest.raises(EdgespecError, match="cannot start /nonexistent/llama-server"):
        Server(missing, SETTINGS).__enter__()


def test_targets_take_turns(fake):
    one, two = fake(), fake()
    workloads = [w for w in sw.load_workloads("test") if w.kind in ("agent", "agent+chat")]
    targets = [Target("one", url=one.url), Target("two", url=two.url)]
    runs = run_all(workloads, targets, SETTINGS, 2, "t7")
    assert [r.target for r in runs] == ["one", "two", "two", "one", "two", "one", "one", "two"]


# ---------------------------------------------------------------- the summary


def record(phase: str, ttft: float | None, e2e: float = 5.0, prompt: int | None = 100,
           cached: int | None = 0, target: str = "a") -> Record:  # fmt: skip
    return Record("w", target, 0, "c", 0, phase, ttft, e2e, prompt, cached, 8, None, None, 0.0)


def test_summary_math():
    assert median([3.0, None, 1.0, 2.0]) == 2.0 and median([None]) is None
    assert ratio(1.0, 4.0) == 0.25 and ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
    returning = [
        record("returning", 1.0, prompt=200, cached=150),
        record("returning", 2.0, prompt=200, cached=50),
        record("returning", 3.0, prompt=None, cached=None),
    ]
    assert cached_share(returning) == 0.5
    runs = [
        WorkloadRun("w", "agent", "a", 0, wall_s=10.0, records=[record("cold", 4.0), *returning[:2]]),
        WorkloadRun(
            "w",
            "agent",
            "a",
            1,
            wall_s=14.0,
            records=[record("cold", 6.0), returning[2], record("resumed", None, e2e=2.5)],
        ),
        WorkloadRun("w", "restart", "b", 0, note="skipped: a --url server"),
    ]
    a, b = summarize(runs)
    assert (a.requests, a.cold_ttft_s, a.returning_ttft_s, a.resumed_ttft_s) == (6, 5.0, 2.0, 2.5)
    assert (a.returning_ratio, a.resumed_ratio, a.cached_share, a.wall_s) == (0.4, 0.5, 0.5, 12.0)
    assert (b.requests, b.wall_s, b.note) == (0, None, "skipped: a --url server")
    table = markdown([a, b]).splitlines()
    assert table[2] == "| w | a | 6 | 5.00 | 2.00 | ×0.40 | 2.50 | ×0.50 | 50% | 5.00 | 12.0 |"
    assert table[3].startswith("| w | b | 0 | skipped") and table[3].count("|") == table[2].count("|")


# ---------------------------------------------------------------- the command line


def test_the_command_line_against_a_url(fake, tmp_path: Path, capsys):
    server = fake()
    out = tmp_path / "sessions.json"
    code = cli_main(["bench", "--sessions", "agent", "restart", "--url", f"fake={server.url}",
                     "--json", str(out), "--split", "dev"])  # fmt: skip
    assert code == 0
    shown = capsys.readouterr()
    assert "| agent-dev | fake | 6 |" in shown.out and "skipped" in shown.out
    assert "agent-dev" in shown.err and "cold" in shown.err
    saved = json.loads(out.read_text())
    assert saved["max_tokens"] == 64 and saved["workloads"] == ["agent-dev", "restart-dev"]
    assert len(saved["runs"][0]["records"]) == 6 and saved["summary"][0]["returning_ratio"] is not None
    assert all(b["max_tokens"] == 64 for b in server.requests)


def test_a_run_stopped_midway_still_reports(fake, tmp_path: Path, capsys):
    out = tmp_path / "partial.json"
    gone = f"gone=http://127.0.0.1:{closed_port()}/v1"
    argv = ["bench", "--sessions", "agent", "--url", f"fake={fake().url}", "--url", gone, "--json", str(out)]
    assert cli_main(argv) == 2
    shown = capsys.readouterr()
    assert "stopped before the end" in shown.out and "| agent-test | fake | 6 |" in shown.out
    assert "gone: GET" in shown.err and "connection refused" in shown.err
    assert json.loads(out.read_text())["complete"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sessions", "chatty"], "unknown sessions workload 'chatty'"),
        (["--sessions", "--configs", "auto"], "--configs is the corpus benchmark's"),
        (["--sessions", "--max-tokens", "0"], "at least 1"),
        (["--sessions", "--threads", "0"], "at least 1"),
        (["--sessions", "--llama-server", "/nonexistent/llama-server"], "no llama-server at"),
        (["--sessions", "--llamacpp-build"], "run python -m lab.llamacpp build"),  # no build here
        (["--sessions", "--url", f"http://127.0.0.1:{closed_port()}/v1"], "connection refused"),
    ],
)
def test_command_line_mistakes_are_one_line(argv: list[str], message: str, capsys):
    # Always a --url: a mistake let through must never start edgespec serve on the models.
    nobody = [] if "--url" in argv else ["--url", f"http://127.0.0.1:{closed_port()}/v1"]
    assert cli_main(["bench", *argv, *nobody]) == 2
    assert message in capsys.readouterr().err


if __name__ == "__main__":  # the server the benchmark starts in the tests above
    FakeServer(int(sys.argv[1])).serve_forever()
