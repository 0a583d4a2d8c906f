"""The agents check (``python -m lab.agents``) without the agents or a model: its
recording proxy in front of a small stand-in HTTP server on loopback (bytes through
unchanged, streaming without buffering, status, times, tool flags and errors recorded for
Anthropic- and Responses-shaped bodies), its data file, one run of a stand-in "agent" (a
Python one-liner) under the time limit, and the report and exit code drawn from records."""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from lab.agent_proxy import Exchange, RecordingProxy, carries_tool_result, scan_answer
from lab.agent_runs import (
    Agent,
    RunResult,
    Task,
    fill,
    isolated_env,
    judge,
    load_spec,
    run_agent,
)
from lab.agents import RunReport, exit_code, render, request_table, write_json

PIECE_GAP_S = 0.3  # between the stand-in's SSE pieces: long enough to tell streaming from buffering

ANTHROPIC_REQUEST = {
    "model": "m",
    "max_tokens": 64,
    "stream": True,
    "tools": [
        {"name": "Read", "input_schema": {"type": "object", "properties": {"type": {"type": "string"}}}}
    ],
    "messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "port 1"}]},
    ],
}
RESPONSES_REQUEST = {
    "model": "m",
    "stream": True,
    "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read it"}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "port 1"},
    ],
}


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


ANTHROPIC_STREAM = [
    _event("message_start", {"type": "message_start", "message": {"id": "m1", "content": []}}),
    _event("content_block_start", {"type": "content_block_start", "index": 0,
           "content_block": {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}}),
    _event("message_stop", {"type": "message_stop"}),
]  # fmt: skip
RESPONSES_STREAM = [
    _event("response.created", {"type": "response.created", "response": {"id": "r1", "output": []}}),
    _event("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
           "item": {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": "{}"}}),
    _event("response.completed", {"type": "response.completed", "response": {"id": "r1"}}),
]  # fmt: skip
TEXT_STREAM = [
    _event("message_start", {"type": "message_start", "message": {"id": "m1", "content": []}}),
    _event("content_block_delta", {"type": "content_block_delta",
           "delta": {"type": "text_delta", "text": "hi"}}),
    _event("message_stop", {"type": "message_stop"}),
]  # fmt: skip
ERROR_STREAM = [
    _event("message_start", {"type": "message_start", "message": {"id": "m1", "content": []}}),
    _event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
]


class StandIn(BaseHTTPRequestHandler):
    """The server behind the proxy: SSE streams in timed pieces (chunked, as uvicorn sends
    them), an echo, an error status, and a stream that breaks off."""

    protocol_version = "HTTP/1.1"
    # path -> when its last piece started to leave (set before it is written, so a client
    # that has read the whole stream always finds it)
    last_piece: ClassVar[dict[str, float]] = {}

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._json(200, {"path": self.path})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        routes = {"/v1/messages": ANTHROPIC_STREAM, "/v1/responses": RESPONSES_STREAM,
                  "/text": TEXT_STREAM, "/stream-error": ERROR_STREAM}  # fmt: skip
        path = self.path.split("?")[0].removeprefix("/base")  # a proxy may add a prefix
        if path in routes:
            self._stream(routes[path])
        elif path == "/echo":
            self._echo(body)
        elif path == "/fail":
            self._json(
                400, {"error": {"message": "unknown field: thinking", "type": "invalid_request_error"}}
            )
        elif path == "/cut":
            self._cut()
        else:
            self._json(404, {"error": {"message": "no such path"}})

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _echo(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Echo-Path", self.path)
        self.send_header("X-Echo-Auth", self.headers.get("Authorization", ""))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, pieces: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(PIECE_GAP_S)
            if i == len(pieces) - 1:
                StandIn.last_piece[self.path] = time.perf_counter()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _cut(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = ANTHROPIC_STREAM[0]
        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)  # gone mid-stream, no last chunk


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(stand_in: str) -> Iterator[RecordingProxy]:
    with RecordingProxy(stand_in) as running:
        yield running


def _post(base: str, path: str, body: bytes, headers: dict | None = None) -> http.client.HTTPResponse:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    return conn.getresponse()


def _one_record(proxy: RecordingProxy) -> Exchange:
    """The only record, once its request is finished (the proxy closes it just after the
    last byte leaves)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        records = proxy.records
        if len(records) == 1 and records[0].total_s is not None:
            return records[0]
        time.sleep(0.01)
    raise AssertionError(f"no finished record: {proxy.records}")


# The proxy


def test_bytes_pass_through_unchanged(proxy: RecordingProxy):
    body = bytes(range(256)) * 300  # every byte value, and more than one read's worth
    answer = _post(proxy.url, "/echo?beta=true", body, {"Authorization": "Bearer local"})
    assert answer.status == 200 and answer.read() == body
    assert answer.getheader("X-Echo-Path") == "/echo?beta=true"  # the query string went along
    assert answer.getheader("X-Echo-Auth") == "Bearer local"
    record = _one_record(proxy)
    assert (record.method, record.path, record.status) == ("POST", "/echo?beta=true", 200)
    assert record.request_bytes == record.response_bytes == len(body)


def test_a_stream_passes_through_without_buffering(proxy: RecordingProxy):
    answer = _post(proxy.url, "/text", b"{}")
    first = answer.read1(65536)
    first_at = time.perf_counter()
    rest = answer.read()
    assert first.startswith(b"event: message_start")
    assert first + rest == b"".join(TEXT_STREAM)
    # The first event arrived while the stand-in was still writing the others.
    assert first_at < StandIn.last_piece["/text"] - PIECE_GAP_S
    record = _one_record(proxy)
    assert record.streamed and record.status == 200
    assert record.ttfb_s is not None and record.total_s is not None
    assert record.ttfb_s < PIECE_GAP_S <= 2 * PIECE_GAP_S <= record.total_s + 0.05


def test_anthropic_tool_round_trip_is_recorded(proxy: RecordingProxy):
    answer = _post(proxy.url, "/v1/messages?beta=true", json.dumps(ANTHROPIC_REQUEST).encode())
    assert answer.read() == b"".join(ANTHROPIC_STREAM)
    record = _one_record(proxy)
    assert record.tool_result and record.tool_call and record.error is None
    assert record.status == 200 and record.path == "/v1/messages?beta=true"


def test_responses_tool_round_trip_is_recorded(proxy: RecordingProxy):
    answer = _post(proxy.url, "/v1/responses", json.dumps(RESPONSES_REQUEST).encode())
    assert answer.read() == b"".join(RESPONSES_STREAM)
    record = _one_record(proxy)
    assert record.tool_result and record.tool_call and record.error is None


def test_no_tool_flags_without_tools(proxy: RecordingProxy):
    # A schema property named "type" holds an object: no flag, and no crash.
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": ANTHROPIC_REQUEST["tools"]}
    _post(proxy.url, "/text", json.dumps(body).encode()).read()
    record = _one_record(proxy)
    assert not record.tool_result and not record.tool_call


def test_an_error_status_is_recorded_with_its_body(proxy: RecordingProxy):
    answer = _post(proxy.url, "/fail", b"{}")
    assert answer.status == 400 and b"unknown field" in answer.read()
    record = _one_record(proxy)
    assert record.status == 400 and "unknown field: thinking" in (record.error or "")


def test_an_error_event_in_a_200_stream_is_recorded(proxy: RecordingProxy):
    _post(proxy.url, "/stream-error", b"{}").read()
    record = _one_record(proxy)
    assert record.status == 200 and "overloaded_error" in (record.error or "")


def test_a_stream_cut_upstream_is_recorded(proxy: RecordingProxy):
    answer = _post(proxy.url, "/cut", b"{}")
    with pytest.raises(http.client.IncompleteRead):
        answer.read()  # the agent sees the stream end short, as it did upstream
    record = _one_record(proxy)
    assert record.status == 200 and "upstream broke off" in (record.error or "")


def test_an_upstream_that_is_down_is_a_502():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with RecordingProxy(f"http://127.0.0.1:{closed}") as proxy:
        answer = _post(proxy.url, "/v1/messages", b"{}")
        assert answer.status == 502 and "proxy_error" in answer.read().decode()
        record = _one_record(proxy)
    assert record.status == 502 and "upstream" in (record.error or "")


def test_the_upstream_path_prefix_is_kept(stand_in: str):
    with RecordingProxy(stand_in + "/base/") as proxy:
        answer = _post(proxy.url, "/echo", b"x")
        answer.read()
    assert answer.getheader("X-Echo-Path") == "/base/echo"


def test_detection_on_non_streamed_and_chat_shapes():
    assert carries_tool_result(json.dumps({"messages": [{"role": "tool", "content": "1"}]}).encode())
    assert not carries_tool_result(b"not json")
    assert scan_answer(json.dumps({"content": [{"type": "tool_use", "name": "Read"}]}).encode(), False)[0]
    chat = {"choices": [{"message": {"tool_calls": [{"id": "1", "function": {"name": "f"}}]}}]}
    assert scan_answer(json.dumps(chat).encode(), False) == (True, None)
    assert scan_answer(b"".join(TEXT_STREAM), True) == (False, None)


# The data file and a run


def test_the_data_file_loads():
    spec = load_spec()
    assert {"claude-code", "codex"} <= set(spec.agents) and {"read", "rename"} <= set(spec.tasks)
    claude, codex = spec.agents["claude-code"], spec.agents["codex"]
    assert claude.package == "@anthropic-ai/claude-code" and codex.package == "@openai/codex"
    assert claude.env["ANTHROPIC_BASE_URL"] == "{proxy}" and "{task}" in claude.args
    assert 'base_url = "{proxy}/v1"' in codex.files[".codex/config.toml"]
    assert 'wire_api = "responses"' in codex.files[".codex/config.toml"]
    assert claude.install_dir(Path("/c")) == Path(f"/c/@anthropic-ai/claude-code@{claude.version}")
    read, rename = spec.tasks["read"], spec.tasks["rename"]
    assert read.answer_contains is not None and read.answer_contains in read.files["notes.txt"]
    assert rename.check_file == "util.py" and "def old_name(" in rename.files["util.py"]
    # Claude Code with all its tools: the same agent but for its arguments, run on request.
    full = spec.agents["claude-code-all-tools"]
    assert not full.by_default and claude.by_default and codex.by_default
    assert full.env == claude.env and full.package == claude.package
    assert "--tools" in claude.args and "--tools" not in full.args


def test_fill_replaces_only_placeholders():
    assert fill('a = "{model}" {x} {old(v)}', {"model": "q"}) == 'a = "q" {x} {old(v)}'


def test_the_agents_own_settings_do_not_leak(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "real-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://elsewhere")
    env = isolated_env(tmp_path, {"ANTHROPIC_AUTH_TOKEN": "local"})
    assert "ANTHROPIC_API_KEY" not in env and "OPENAI_BASE_URL" not in env
    assert env["HOME"] == str(tmp_path) and env["ANTHROPIC_AUTH_TOKEN"] == "local"


def test_judging_the_tasks(tmp_path: Path):
    spec = load_spec()
    read, rename = spec.tasks["read"], spec.tasks["rename"]
    assert judge(read, tmp_path, f"It is {read.answer_contains}.")[0] is True
    assert judge(read, tmp_path, None) == (False, "no answer")
    (tmp_path / "util.py").write_text(rename.files["util.py"])
    assert judge(rename, tmp_path, None) == (False, "util.py unchanged")
    (tmp_path / "util.py").write_text(rename.files["util.py"].replace("old_name", "new_name"))
    assert judge(rename, tmp_path, None)[0] is True


def _python_agent(code: str, **overrides: object) -> Agent:
    """A stand-in agent: this Python running ``code`` with the answer file and the task."""
    fields = {"name": "fake", "package": "fake", "version": "1", "bin": "python", "api": "/v1/x",
              "answer": "file", "args": ("-c", code, "{answer}", "{task}"),
              "env": {"FAKE_BASE": "{proxy}/v1"}, "error_patterns": ("API Error",)}  # fmt: skip
    return Agent(**{**fields, **overrides})


def test_a_run_in_a_fresh_folder(tmp_path: Path):
    code = (
        "import os, sys; from pathlib import Path\n"
        "Path(sys.argv[1]).write_text(Path('notes.txt').read_text() + os.environ['FAKE_BASE'])\n"
        "print('API Error: 400 unknown field')\n"
    )
    task = Task("read", "what port?", files={"notes.txt": "port 48213\n"}, answer_contains="48213")
    run = run_agent(_python_agent(code), Path(sys.executable), task, proxy_url="http://127.0.0.1:1",
                    model="m", key="k", time_limit_s=30)  # fmt: skip
    assert run.exit_code == 0 and not run.timed_out
    assert run.task_done is True and run.answer == "port 48213\nhttp://127.0.0.1:1/v1"
    assert run.agent_errors == ["API Error: 400 unknown field"]


def test_a_run_past_its_time_limit_is_stopped_with_its_children(tmp_path: Path):
    marker = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen(['sleep', '60']); open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    task = Task("read", "what port?", answer_contains="1")
    started = time.monotonic()
    run = run_agent(_python_agent(code), Path(sys.executable), task, proxy_url="http://127.0.0.1:1",
                    model="m", key="k", time_limit_s=1.0)  # fmt: skip
    assert run.timed_out and run.exit_code is None and time.monotonic() - started < 15
    assert not _alive(int(marker.read_text()))  # the whole process group went, not only the agent


def test_what_a_finished_run_left_running_is_stopped(tmp_path: Path):
    marker = tmp_path / "child.pid"
    code = (
        f"import subprocess; open({str(marker)!r}, 'w').write(str(subprocess.Popen(['sleep', '60']).pid))\n"
    )
    run = run_agent(_python_agent(code), Path(sys.executable), Task("read", "?"), proxy_url="http://127.0.0.1:1",
                    model="m", key="k", time_limit_s=30)  # fmt: skip
    assert run.exit_code == 0 and not run.timed_out
    assert not _alive(int(marker.read_text()))


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie nobody reaps, as in a container, does not)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not Path("/proc").is_dir():  # no procfs (macOS): a zombie would count as alive
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            time.sleep(0.05)
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


# The report


def _exchange(path: str, status: int | None, *, result: bool = False, call: bool = False,
              error: str | None = None) -> Exchange:  # fmt: skip
    return Exchange("POST", path, started_s=0.0, request_bytes=2048, tool_result=result, status=status,
                    tool_call=call, ttfb_s=0.25, total_s=1.5, error=error)  # fmt: skip


def _run(agent: str = "claude-code", errors: list[str] | None = None) -> RunResult:
    return RunResult(agent, "read", 0, False, 3.0, "48213", True, "answered 48213", errors or [], "")


def test_the_report_follows_the_records(tmp_path: Path):
    good = RunReport(_run(), [_exchange("/v1/messages", 200, call=True),
                              _exchange("/v1/messages", 200, result=True)], "2.1")  # fmt: skip
    refused = RunReport(_run("codex"), [_exchange("/v1/responses", 400, error="unknown field")] * 2, "0.1")
    silent = RunReport(_run("codex", ["ERROR: stream disconnected"]), [], "0.1")
    assert good.protocol_held and good.tool_round_trip and good.failures == []
    assert not refused.protocol_held and not refused.tool_round_trip
    assert refused.failures == ["POST /v1/responses -> 400: unknown field (x2)"]
    assert silent.failures == ["agent printed: ERROR: stream disconnected", "no request reached the server"]
    assert exit_code([good]) == 0 and exit_code([good, refused]) == 1 and exit_code([]) == 1
    table = request_table(good.requests)
    assert table[0].split() == ["#", "request", "status", "req", "KB", "TTFB", "s", "total", "s", "tools"]
    assert table[1].split() == ["1", "POST", "/v1/messages", "200", "2.0", "0.25", "1.50", "call"]
    assert table[2].split()[-1] == "result"
    text = render([good, refused])
    assert "protocol held: yes; tool round trip: yes" in text and "protocol held: NO" in text
    assert text.endswith("protocol held in 1 of 2 runs")
    path = tmp_path / "agents.json"
    write_json(path, [good, refused], "http://127.0.0.1:8080", "m")
    saved = json.loads(path.read_text())
    assert [r["protocol_held"] for r in saved["runs"]] == [True, False]
    assert saved["runs"][0]["requests"][1]["tool_result"] is True
