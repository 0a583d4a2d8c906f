"""The sessions benchmark's side of the wire: a streaming chat client on the standard
library alone (so that it talks to any OpenAI-compatible server the same way), and the
servers it starts itself, one at a time, on a free loopback port.

Every failure (a server that does not come up, a refused connection, a status other than
200, an error sent in the stream) is one ``EdgespecError`` line naming the server and the
request; a started server is stopped however its block is left, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import itertools
import json
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

from edgespec.errors import EdgespecError

PORT = "{port}"  # stands for the free port in a start command
LLAMA_SERVER_SLOTS = 4
LLAMA_SERVER_CACHE_MIB = 2048
STOP_WAIT_S = 30.0
PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class Reply:
    text: str
    ttft_s: float | None  # to the first non-empty content delta; None: no content at all
    e2e_s: float
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    cache_n: int | None = None  # llama-server's timings, where the server sent them
    prompt_n: int | None = None


@dataclass
class Endpoint:
    label: str
    base_url: str  # ends with the API's prefix, e.g. http://127.0.0.1:8080/v1
    model: str = ""
    api_key: str | None = None


def sse_data(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The data of each server-sent event in ``lines``, up to ``[DONE]``: multi-line data
    joined by newlines, comments and other fields skipped (the SSE specification)."""
    data: list[str] = []
    for raw in itertools.chain(lines, [""]):  # a last blank line ends an event left open
        line = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        if not line:
            if data:
                payload, data = "\n".join(data), []
                if payload == "[DONE]":
                    return
                yield payload
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def token_counts(usage: dict | None, timings: dict | None) -> dict[str, int | None]:
    """Prompt, cached and completion tokens from OpenAI's ``usage``, else from
    llama-server's ``timings`` (``cache_n`` cached, ``prompt_n`` computed)."""
    u = usage if isinstance(usage, dict) else {}
    t = timings if isinstance(timings, dict) else {}
    cache_n, prompt_n = _int(t.get("cache_n")), _int(t.get("prompt_n"))
    prompt = _int(u.get("prompt_tokens"))
    if prompt is None and cache_n is not None and prompt_n is not None:
        prompt = cache_n + prompt_n
    details = u.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    completion = _int(u.get("completion_tokens"))
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cache_n if cached is None else cached,
        "completion_tokens": _int(t.get("predicted_n")) if completion is None else completion,
        "cache_n": cache_n,
        "prompt_n": prompt_n,
    }


def _error_text(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error", body)
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or "") or None
    return str(error)


def read_reply(
    events: Iterable[str], started: float, clock: Callable[[], float] = time.perf_counter
) -> Reply:
    """A streamed chat completion's text, timings and token counts, timed from ``started``."""
    text: list[str] = []
    first: float | None = None
    usage = timings = None
    for payload in events:
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise EdgespecError(f"the stream sent something that is not JSON: {payload[:80]!r}") from None
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            raise EdgespecError(f"the server reported an error in the stream: {_error_text(chunk)}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            piece = delta.get("content") if isinstance(delta, dict) else None
            if piece and isinstance(piece, str):
                first = clock() - started if first is None else first
                text.append(piece)
        usage, timings = chunk.get("usage") or usage, chunk.get("timings") or timings
    return Reply("".join(text), first, clock() - started, **token_counts(usage, timings))


def api_url(url: str) -> str:
    """``url`` without a trailing slash; a bare host gets OpenAI's ``/v1``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EdgespecError(f"not an http(s) URL: {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") or "/v1", "", ""))


def _connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname or "", parts.port, timeout=timeout), parts.path or "/"


def _headers(api_key: str | None) -> dict[str, str]:
    found = {"Content-Type": "application/json"}
    return {**found, "Authorization": f"Bearer {api_key}"} if api_key else found


@contextmanager
def _one_line(what: str) -> Iterator[None]:
    """A network failure as one line naming the request, never a traceback."""
    try:
        yield
    except ConnectionRefusedError:
        raise EdgespecError(f"{what}: connection refused (is the server running?)") from None
    except TimeoutError:
        raise EdgespecError(f"{what}: no answer within the timeout") from None
    except (OSError, http.client.HTTPException) as e:
        raise EdgespecError(f"{what}: {type(e).__name__}: {e}") from None


def get_json(url: str, api_key: str | None = None, timeout: float = 5.0) -> tuple[int, Any]:
    """GET ``url``: its status and its body as JSON (None when it is not). Raises OSError
    and HTTPException as they come: polling a starting server expects them."""
    conn, path = _connect(url, timeout)
    try:
        conn.request("GET", path, headers=_headers(api_key))
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, None


def first_model(endpoint: Endpoint, timeout: float = 30.0) -> str:
    """The first model ``/models`` lists: what a server serves when it serves one."""
    url = f"{endpoint.base_url}/models"
    with _one_line(f"{endpoint.label}: GET {url}"):
        status, body = get_json(url, endpoint.api_key, timeout)
    if status != 200:
        raise EdgespecError(f"{endpoint.label}: GET {url}: HTTP {status}: {_error_text(body)}")
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise EdgespecError(f"{endpoint.label}: {url} lists no model; name one with --model") from None


def chat(endpoint: Endpoint, messages: list[dict], *, max_tokens: int, timeout: float) -> Reply:
    """One streamed, greedy chat completion, timed at the client."""
    body = {"model": endpoint.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    url = f"{endpoint.base_url}/chat/completions"
    what = f"{endpoint.label}: POST {url}"
    conn, path = _connect(url, timeout)
    try:
        with _one_line(what):
            started = time.perf_counter()
            conn.request("POST", path, json.dumps(body), _headers(endpoint.api_key))
            response = conn.getresponse()
            if response.status != 200:
                raw = response.read()
                try:
                    message = _error_text(json.loads(raw))
                except ValueError:
                    message = raw[:200].decode("utf-8", "replace")
                raise EdgespecError(f"{what}: HTTP {response.status}: {message}")
            try:
                return read_reply(sse_data(iter(response.readline, b"")), started)
            except EdgespecError as e:  # the stream's own failures, named like the others
                raise EdgespecError(f"{what}: {e}") from None
    finally:
        conn.close()


# ---------------------------------------------------------------- the servers


@dataclass(frozen=True)
class Settings:
    max_tokens: int = 64
    ctx: int = 4096
    threads: int = 1
    model: str | None = None  # None: the first one /models lists
    api_key: str | None = None
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 900.0


@dataclass(frozen=True)
class Target:
    """A server to measure: one already running (``url``), or one this benchmark starts
    with ``command`` (``PORT`` in it stands for a free port) and can restart."""

    label: str
    url: str | None = None
    command: tuple[str, ...] = ()

    @property
    def started_here(self) -> bool:
        return bool(self.command)


def _dies_with_us() -> None:
    """Run in a started server's process before it execs (Linux): it gets SIGTERM when the
    thread that started it dies, however it dies (killed, a timeout's SIGTERM), so that a
    benchmark that is gone never leaves a model server running beside the next one."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _health(base: str) -> bool | str:
    """True once ``/health`` says 200; a load failure's message (edgespec says
    ``{"status": "error", "message": …}``); False while loading or not listening yet."""
    try:
        status, body = get_json(f"{base}/health", timeout=2.0)
    except (OSError, http.client.HTTPException):
        return False
    if status == 200:
        return True
    if isinstance(body, dict) and body.get("status") == "error":
        return str(body.get("message") or "loading failed")
    return False


class Server:
    """A target while it serves: its endpoint, and for a started server its process, which
    is stopped on leaving the block however it is left (an error, Ctrl-C)."""

    def __init__(self, target: Target, settings: Settings):
        self.target, self.settings = target, settings
        self.endpoint = Endpoint(
            target.label, api_url(target.url or "http://127.0.0.1"), api_key=settings.api_key
        )
        self._process: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Server:
        try:
            if self.target.started_here:
                self._start()
            self.endpoint.model = self.settings.model or first_model(self.endpoint)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def restart(self) -> float:
        """Stop the server and start it again; the seconds that took."""
        started = time.perf_counter()
        self._stop()
        self._start()
        return time.perf_counter() - started

    def _start(self) -> None:
        port = free_port()
        command = [part.replace(PORT, str(port)) for part in self.target.command]
        # A file, not a pipe: a chatty server must never block on a full pipe. Closed in _stop.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        print(f"{self.target.label}: starting {shlex.join(command)}", file=sys.stderr, flush=True)
        try:
            self._process = subprocess.Popen(
                command, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_dies_with_us
            )
        except OSError as e:
            raise EdgespecError(
                f"{self.target.label}: cannot start {command[0]}: {e.strerror or e}"
            ) from None
        base = f"http://127.0.0.1:{port}"
        self._wait_ready(base)
        self.endpoint.base_url = f"{base}/v1"

    def _wait_ready(self, base: str) -> None:
        label, timeout = self.target.label, self.settings.startup_timeout_s
        deadline = time.monotonic() + timeout
        while (state := _health(base)) is not True:
            if isinstance(state, str):
                raise EdgespecError(f"{label} failed to load: {state}")
            if self._process is not None and (code := self._process.poll()) is not None:
                raise EdgespecError(f"{label} exited with code {code} before it was ready: {self._tail()}")
            if time.monotonic() > deadline:
                raise EdgespecError(f"{label} was not ready within {timeout:.0f} s: {self._tail()}")
            time.sleep(0.5)

    def _tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [line for line in self._log.read().decode("utf-8", "replace").splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-400:] or "(no output)"

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            except KeyboardInterrupt:  # a second Ctrl-C: stop it now rather than leave it running
                process.kill()
                process.wait()
                raise
        if self._log is not None:
            self._log.close()
            self._log = None


def edgespec_command(target: str, draft: str, settings: Settings, extra: str = "") -> tuple[str, ...]:
    """``edgespec serve`` on a free loopback port; ``extra``: more of its options."""
    return (sys.executable, "-m", "edgespec", "serve", "--host", "127.0.0.1", "--port", PORT,
            "--target", target, "--draft", draft, "--ctx", str(settings.ctx),
            "--threads", str(settings.threads), *_split(extra))  # fmt: skip


def llama_server_command(
    binary: Path, target: Path, draft: Path | None, settings: Settings, extra: str = ""
) -> tuple[str, ...]:
    """llama-server on the same GGUFs, context and threads, with its prompt cache in RAM.
    ``--ctx`` is per conversation for both: edgespec gives each of its slots that much;
    llama-server's 4 slots share one pool (``-kvu``) of 4 × ``ctx`` tokens, the same memory,
    each slot free to use up to all of it."""
    threads = str(settings.threads)
    pool = str(settings.ctx * LLAMA_SERVER_SLOTS)
    command = [str(binary), "-m", str(target), "-c", pool, "-np", str(LLAMA_SERVER_SLOTS),
               "-kvu", "--cache-ram", str(LLAMA_SERVER_CACHE_MIB), "--host", "127.0.0.1", "--port", PORT,
               "-t", threads, "-tb", threads]  # fmt: skip
    if draft is not None:
        command += ["-md", str(draft), "-td", threads, "-tbd", threads]
    return (*command, *_split(extra))


def _split(extra: str) -> list[str]:
    try:
        return shlex.split(extra)
    except ValueError as e:
        raise EdgespecError(f"cannot split the extra server options {extra!r}: {e}") from None
