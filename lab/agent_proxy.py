"""A recording reverse proxy for the agents check (``python -m lab.agents``).

It listens on a free loopback port in front of one base URL and relays every request
unchanged, streaming the answer through as it arrives (an SSE stream is never held back
to be buffered), and records for each request what the report needs: the path, the
status, the sizes, whether the request carried a tool's result and the answer a tool
call, the time to the answer's first byte and to its end, and any error it carried.

Standard library only: one thread per connection (``ThreadingHTTPServer``) and one
upstream connection per request, which is plenty for one agent on loopback.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from edgespec.bench.session_servers import sse_data
from edgespec.errors import EdgespecError

READ_SIZE = 64 * 1024
SCAN_LIMIT = 4 * 1024 * 1024  # response bytes kept for the tool/error scan; the rest only relayed
ERROR_CHARS = 1000
POLL_S = 0.05  # how often the serving loop looks for shutdown: closing takes no longer
UPSTREAM_TIMEOUT_S = 3600.0  # a slow CPU model may think for minutes before its first token

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never relayed.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Also set anew on the way out: the body is read whole here (an Expect: 100-continue was
# answered already) and sent with its own length.
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect", "accept-encoding"}
# A tool's result sent back, in the Anthropic Messages and OpenAI Responses shapes (and the
# Chat Completions "tool" role, for agents that speak that).
TOOL_RESULT_TYPES = frozenset(
    {"tool_result", "function_call_output", "custom_tool_call_output", "local_shell_call_output"}
)
TOOL_CALL_TYPES = frozenset({"tool_use", "function_call", "custom_tool_call", "local_shell_call"})
STREAM_ERROR_TYPES = frozenset({"error", "response.failed"})


@dataclass
class Exchange:
    """One request through the proxy. ``status`` is None while it is in flight (or when
    the upstream never answered: then ``error`` says why and the agent got a 502)."""

    method: str
    path: str
    started_s: float  # since the proxy started, to order the requests of one run
    request_bytes: int
    tool_result: bool = False  # the request body carried a tool's result
    status: int | None = None
    response_bytes: int = 0
    streamed: bool = False  # the answer was an SSE stream
    tool_call: bool = False  # the answer asked for a tool call
    ttfb_s: float | None = None  # to the answer's first body byte
    total_s: float | None = None  # to the answer's end; set last, when the record is whole
    error: str | None = None  # an error status's body, an error event in a stream, a cut upstream
    client_closed: bool = False  # the agent hung up before the answer's end

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _walk(value: Any) -> Iterator[dict]:
    """Every JSON object inside ``value``, depth first, without recursion (a body nested
    deep must not raise RecursionError inside a proxy thread)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _kind(node: dict) -> str | None:
    """A node's ``type`` when it is a string (in a JSON schema a property may be named
    "type" and hold an object)."""
    kind = node.get("type")
    return kind if isinstance(kind, str) else None


def _decoded(body: bytes, encoding: str) -> bytes | None:
    """The body without its content coding; None for one this cannot undo."""
    encoding = encoding.strip().lower()
    try:
        if encoding in ("", "identity"):
            return body
        if encoding in ("gzip", "x-gzip"):
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error, EOFError):
        return None
    return None


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def carries_tool_result(body: bytes, content_encoding: str = "") -> bool:
    """Whether a request body sends a tool's result back to the model: an Anthropic
    ``tool_result`` block, a Responses ``function_call_output`` item (or its custom and
    shell kinds), or a Chat Completions message with role ``tool``."""
    data = _decoded(body, content_encoding)
    parsed = _json(data) if data else None
    return any(_kind(node) in TOOL_RESULT_TYPES or node.get("role") == "tool" for node in _walk(parsed))


def _payloads(body: bytes, streamed: bool) -> Iterator[Any]:
    """The JSON documents of an answer: each SSE event's data, or the whole body."""
    if not streamed:
        yield _json(body)
        return
    for payload in sse_data(body.splitlines(keepends=True)):
        yield _json(payload.encode())


def scan_answer(body: bytes, streamed: bool) -> tuple[bool, str | None]:
    """(whether the answer called a tool, the first error event it carried). A call is a
    ``tool_use`` block (Anthropic), a ``function_call`` item (Responses, and its custom and
    shell kinds) or non-empty ``tool_calls`` (Chat Completions); an error is an event of
    type ``error`` or ``response.failed``, which a stream sends after its 200."""
    tool_call, error = False, None
    for payload in _payloads(body, streamed):
        for node in _walk(payload):
            kind = _kind(node)
            if kind in TOOL_CALL_TYPES or node.get("tool_calls"):
                tool_call = True
            if error is None and kind in STREAM_ERROR_TYPES:
                error = json.dumps(payload)[:ERROR_CHARS]
    return tool_call, error


class _Handler(BaseHTTPRequestHandler):
    """Relays one connection's requests (keep-alive: HTTP/1.1) to the upstream."""

    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the records are the log, and the agents' output must stay readable."""

    def do_GET(self) -> None:
        self._relay()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        parts = []
        while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers, then the blank line
            pass
        return b"".join(parts)

    def _forward_headers(self, body: bytes) -> dict[str, str]:
        """The request's headers for the upstream: its own framing, host and (for an
        uncompressed answer the scan can read; loopback needs no gzip) encoding."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in NOT_FORWARDED}
        headers["Accept-Encoding"] = "identity"
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        return headers

    def _relay(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        arrived = time.perf_counter()  # the times are the server's: from the whole request on
        record = proxy.open_record(self.command, self.path, len(body))
        try:
            record.tool_result = carries_tool_result(body, self.headers.get("Content-Encoding", ""))
            self._forward(record, body, arrived)
        except Exception as exc:  # a fault of the proxy's own must show in the report, not as a hang-up
            reason = f"proxy fault: {type(exc).__name__}: {exc}"
            if record.status is None:
                self._bad_gateway(record, arrived, reason)
            else:
                record.error = reason
            self.close_connection = True

    def _forward(self, record: Exchange, body: bytes, arrived: float) -> None:
        proxy = self.server.proxy
        upstream = http.client.HTTPConnection(proxy.host, proxy.port, timeout=UPSTREAM_TIMEOUT_S)
        headers = self._forward_headers(body)
        try:
            upstream.request(self.command, proxy.prefix + self.path, body=body, headers=headers)
            answer = upstream.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            upstream.close()
            self._bad_gateway(record, arrived, f"upstream {proxy.upstream}: {exc}")
            return
        try:
            self._stream_back(record, answer, arrived)
        finally:
            upstream.close()

    def _bad_gateway(self, record: Exchange, arrived: float, reason: str) -> None:
        """The upstream is down or broke the connection: the agent gets a 502 in OpenAI's
        error shape, and the record says why."""
        payload = json.dumps({"error": {"message": reason, "type": "proxy_error"}}).encode()
        record.status, record.error = 502, reason
        record.total_s = time.perf_counter() - arrived
        with contextlib.suppress(OSError):
            self.send_response_only(502)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

    def _stream_back(self, record: Exchange, answer: http.client.HTTPResponse, arrived: float) -> None:
        record.status = answer.status
        record.streamed = "text/event-stream" in (answer.getheader("Content-Type") or "")
        length = answer.getheader("Content-Length")
        bodiless = self.command == "HEAD" or answer.status in (204, 304) or 100 <= answer.status < 200
        chunked = length is None and not bodiless  # re-framed here: the upstream's framing is per hop
        kept = bytearray()
        if not self._send_head(answer, chunked):
            record.client_closed = True
            complete = False
        else:
            complete = bodiless or self._pump(record, answer, chunked, kept, arrived)
        if complete and chunked:
            complete = self._send(b"0\r\n\r\n")
        if not complete:
            self.close_connection = True  # a cut stream: the agent must see it end, not hang
        total_s = time.perf_counter() - arrived
        self._scan(record, bytes(kept), answer)
        record.total_s = total_s  # last: a record with its total is finished, read whole

    def _send_head(self, answer: http.client.HTTPResponse, chunked: bool) -> bool:
        """The status line and the upstream's headers (less its framing); False when the
        agent has gone already."""
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        try:
            self.end_headers()
        except OSError:
            return False
        return True

    def _pump(
        self, record: Exchange, answer: http.client.HTTPResponse, chunked: bool, kept: bytearray, since: float
    ) -> bool:
        """Relay the body piece by piece as it arrives; True when all of it got through.
        A failure upstream is the server's (``error``), one downstream the agent's, which
        hung up (``client_closed``): agents cancel requests, that is no protocol fault."""
        while True:
            try:
                piece = answer.read1(READ_SIZE)
            except (OSError, http.client.HTTPException) as exc:
                record.error = f"upstream broke off after {record.response_bytes} bytes: {exc}"
                return False
            if not piece:
                return True
            if record.ttfb_s is None:
                record.ttfb_s = time.perf_counter() - since
            record.response_bytes += len(piece)
            if len(kept) < SCAN_LIMIT:
                kept += piece
            if not self._send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece):
                record.client_closed = True
                return False

    def _send(self, data: bytes) -> bool:
        """Write and flush at once (an SSE event must not wait for the next); False when
        the agent has gone."""
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return False
        return True

    def _scan(self, record: Exchange, kept: bytes, answer: http.client.HTTPResponse) -> None:
        data = _decoded(kept, answer.getheader("Content-Encoding") or "") or b""
        record.tool_call, stream_error = scan_answer(data, record.streamed)
        if record.status is not None and record.status >= 400:
            record.error = data.decode("utf-8", "replace")[:ERROR_CHARS] or f"HTTP {record.status}"
        elif stream_error and record.error is None:
            record.error = stream_error


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True  # a stream still open when the run ends must not hold the exit
    proxy: RecordingProxy


class RecordingProxy:
    """The proxy, running in a background thread while its block lasts.

    ``url`` is its base URL (the upstream's path prefix is added on the way out, so give
    the agents the same suffix, e.g. ``/v1``, that the upstream needs); ``records`` every
    request so far, in the order they arrived."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise EdgespecError(f"the proxy needs an http:// upstream URL, not {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._server = _ProxyServer((host, port), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._records: list[Exchange] = []
        self._started = time.perf_counter()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def records(self) -> list[Exchange]:
        with self._lock:
            return list(self._records)

    def open_record(self, method: str, path: str, request_bytes: int) -> Exchange:
        """A new record, listed at once so that a request still in flight when an agent
        is stopped shows up in its run."""
        record = Exchange(method, path, time.perf_counter() - self._started, request_bytes)
        with self._lock:
            self._records.append(record)
        return record

    def __enter__(self) -> RecordingProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_S,), name="agent-proxy", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
