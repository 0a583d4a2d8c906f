"""A real ``edgespec serve`` process for the server tests, on a free loopback port.

Each test module starts one server (loading the real default pair takes seconds) and
shares it between its tests; the fixture waits for ``/health`` to turn 200 and stops the
process afterwards. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
CTX = "2048"
# Loading the pair is seconds; a first measurement of the cost profile on a busy machine
# can take a minute or two.
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    port: int
    api_key: str | None
    process: subprocess.Popen
    # The /health bodies seen while waiting for the server to come up, in order.
    health_seen: list[tuple[int, dict]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self):
        from openai import OpenAI

        # max_retries=0: a test must see the server's own answer, never a retried one.
        return OpenAI(base_url=self.base_url, api_key=self.api_key or "unused", max_retries=0, timeout=300)


@contextmanager
def serve(*args: str, api_key: str | None = None) -> Iterator[Server]:
    port = free_port()
    argv = [sys.executable, "-m", "edgespec", "serve", "--host", HOST, "--port", str(port), "--ctx", CTX]
    if api_key:
        argv += ["--api-key", api_key]
    with tempfile.TemporaryFile(mode="w+") as log:
        # Output goes to a file: a progress bar must never block on a full pipe.
        process = subprocess.Popen(
            [*argv, *args], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ)
        )
        server = Server(f"http://{HOST}:{port}", port, api_key, process)
        try:
            _wait_healthy(server, log)
            yield server
        finally:
            terminate(process, 30)


def terminate(process: subprocess.Popen, within: float) -> None:
    """Stop a server as Ctrl-C's neighbour SIGTERM does; killed if it takes longer than
    ``within`` seconds."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_healthy(server: Server, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"edgespec serve exited with {server.process.returncode}:\n{log.read()}")
        try:
            response = httpx.get(f"{server.url}/health", timeout=2)
        except httpx.HTTPError:
            pass  # not listening yet
        else:
            server.health_seen.append((response.status_code, response.json()))
            if response.status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"edgespec serve did not become healthy in {START_TIMEOUT_S} s")


def cli_reference(prompt: str, max_tokens: int) -> str:
    """The target's own greedy answer to one chat message, from ``edgespec generate
    --drafter none`` in its own process: what every server answer must equal."""
    result = subprocess.run(
        [sys.executable, "-m", "edgespec", "generate", "--chat", "--prompt", prompt, "--drafter", "none",
         "--max-tokens", str(max_tokens), "--ctx", CTX, "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])["text"]


def sse_events(response: httpx.Response) -> Iterator[dict | str]:
    """The ``data:`` payloads of a server-sent event stream: parsed JSON, or "[DONE]"."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            assert line == "", f"unexpected stream line {line!r}"
            continue
        payload = line[len("data: ") :]
        yield payload if payload == "[DONE]" else json.loads(payload)


def ask(server: Server, content: str, max_tokens: int = 12) -> str:
    """One chat message's answer, through the openai client."""
    answer = server.client().chat.completions.create(
        model="default", messages=[{"role": "user", "content": content}], max_tokens=max_tokens
    )
    return answer.choices[0].message.content


def long_story(max_tokens: int) -> dict:
    """A streamed request whose answer runs as long as ``max_tokens`` allows."""
    return {
        "messages": [
            {"role": "user", "content": "Write a very long, detailed story about a lighthouse keeper."}
        ],
        "max_tokens": max_tokens,
        "stream": True,
        "drafter": "none",
    }
