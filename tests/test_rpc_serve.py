"""``edgespec serve --rpc`` when its worker is lost mid-answer, and when it comes back.

A real ``edgespec worker`` on loopback, a real ``edgespec serve`` split over it (under the
CLI's crash supervisor, as a user runs it), real HTTP: the worker is killed while an answer
streams; the answer ends with an error within the bound, ``/health`` answers all along (503
once the worker is lost), the next request is refused with 503 and ``Retry-After`` at once;
the worker started again on its port, the same server process answers again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from conftest import REPO
from test_rpc import free_port, start_worker

from edgespec.runtime import rpc
from tests.server_fixtures import terminate

pytestmark = pytest.mark.skipif(
    not rpc.available(), reason=f"this llama.cpp build has no RPC backend: {rpc.unavailable_reason()}"
)

# A port of its own, kept from run to run: the split target's cost profile is keyed by its
# worker's address, and is measured at the first run only (minutes on a small CPU).
WORKER_PORT = 50874
START_S = 600.0  # the first start measures that profile
LOST_BOUND_S = 30.0  # the bar: a client sees its answer fail within this
REFUSED_S = 10.0  # a request to a server whose worker is lost is refused, not held
DOWN_S = 4.0  # how long the worker stays down
BACK_S = 240.0  # worker started again → the server answers again (a restart and a load)
STOP_S = 60.0


@dataclass
class Poll:
    at: float
    status: int | None  # None: no answer
    body: dict | str
    error: str = ""


@dataclass
class HealthWatch:
    """``/health`` asked again and again on fresh connections, from another thread."""

    url: str
    polls: list[Poll] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            at = time.monotonic()
            try:
                response = httpx.get(f"{self.url}/health", timeout=30)
                self.polls.append(Poll(at, response.status_code, response.json()))
            except (httpx.HTTPError, ValueError) as exc:
                self.polls.append(Poll(at, None, "", f"{type(exc).__name__}: {exc}"))
            self.stop.wait(0.25)

    def between(self, start: float, end: float) -> list[Poll]:
        return [poll for poll in self.polls if start <= poll.at <= end]


@contextlib.contextmanager
def pinned(side: int) -> Iterator[None]:
    """Processes started meanwhile run on their own half of this one's cores (``side`` 0
    or 1), when it has two or more: the server's cost profile then counts no work of the
    worker's as another process's (which would make it provisional, and measured again at
    every start), as when the worker is another machine."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        yield
        return
    mine = sorted(os.sched_getaffinity(0))
    half = len(mine) // 2
    os.sched_setaffinity(0, mine[:half] if side == 0 else mine[half:])
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def worker_port() -> int:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", WORKER_PORT)) != 0:
            return WORKER_PORT
    return free_port()  # taken: a fresh port (and a profile measured for it)


@contextlib.contextmanager
def split_server(target: Path, worker: str, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``edgespec serve`` with its target split over ``worker``, healthy; its output in ``log``."""
    port = free_port()
    argv = [sys.executable, "-m", "edgespec", "serve", "--port", str(port), "--target", str(target),
            "--draft", "none", "--rpc", worker, "--tensor-split", "1,1", "--threads", "1", "--ctx", "512",
            "--parallel", "2"]  # fmt: skip
    with log.open("w") as out, pinned(0):
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, log, START_S)
        yield url, process
    finally:
        terminate(process, 60)


def wait_healthy(url: str, process: subprocess.Popen, log: Path, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert process.poll() is None, f"edgespec serve exited with {process.returncode}:\n{log.read_text()}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"edgespec serve was not healthy within {within:g} s:\n{log.read_text()}")


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux; empty elsewhere)."""
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(child) for child in path.read_text().split())
    return found


class Embedding(threading.Thread):
    """``/v1/embeddings`` of many texts (seconds of work over the worker), from a thread:
    its status once answered (None until then)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.status: int | None = None
        self.text = ""

    def run(self) -> None:
        texts = [f"Passage {n}: the keeper wrote in the log every evening at dusk." for n in range(96)]
        try:
            body = {"input": texts}
            response = httpx.post(f"{self.url}/v1/embeddings", json=body, timeout=LOST_BOUND_S * 4)
            self.status, self.text = response.status_code, response.text
        except httpx.HTTPError as exc:
            self.text = f"{type(exc).__name__}: {exc}"


def chat(url: str, content: str, max_tokens: int, timeout: float) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "drafter": "none"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)


def test_a_worker_lost_mid_answer_and_back(target_path: Path, tmp_path: Path) -> None:
    port = worker_port()
    endpoint = f"127.0.0.1:{port}"
    with pinned(1):
        worker = start_worker(port)
    log = tmp_path / "serve.log"
    try:
        with split_server(target_path, endpoint, log) as (url, server):
            watch = HealthWatch(url)
            poller = threading.Thread(target=watch.run, daemon=True)
            poller.start()
            try:
                check_lost_and_back(url, server, worker, port, endpoint, watch, log)
            finally:
                watch.stop.set()
                poller.join(60)
    finally:
        worker.kill()
        worker.wait()


def check_lost_and_back(
    url: str,
    server: subprocess.Popen,
    worker: subprocess.Popen,
    port: int,
    endpoint: str,
    watch: HealthWatch,
    log: Path,
) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Write a very long story about a lighthouse keeper."}],
        max_tokens=400,
        stream=True,
        extra_body={"drafter": "none"},
    )
    chunks = iter(stream)
    serving = children(server.pid)  # the crash supervisor's child, which serves
    while not next(chunks).choices[0].delta.content:
        pass  # the answer is decoding over the worker
    embedding = Embedding(url)  # an embedding request whose batches take turns with the answer
    embedding.start()
    time.sleep(1.0)
    worker.kill()
    killed = time.monotonic()
    with pytest.raises(openai.APIError) as failed:
        for _ in chunks:
            pass
    seen = time.monotonic()
    assert seen - killed < LOST_BOUND_S
    assert endpoint in str(failed.value) and "unavailable" in str(failed.value), failed.value
    # The embedding request in flight is refused too, within the same bound.
    embedding.join(max(1.0, LOST_BOUND_S - (time.monotonic() - killed)))
    assert embedding.status == 503, (embedding.status, embedding.text[:300])
    assert "unavailable" in embedding.text
    worker.wait()

    # The next request: refused at once, with when to come back.
    asked = time.monotonic()
    refused = chat(url, "Hello", 8, timeout=REFUSED_S)
    assert time.monotonic() - asked < REFUSED_S
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) > 0
    message = refused.json()["error"]["message"]
    assert "unavailable" in message and f"lost the connection to worker {endpoint}" in message, message
    health = httpx.get(f"{url}/health", timeout=REFUSED_S)
    assert health.status_code == 503 and int(health.headers["Retry-After"]) > 0
    assert health.json()["status"] == "unavailable" and endpoint in health.json()["message"]

    # /health answered all along, 503 once the loss was seen (the worker stays down a while).
    time.sleep(DOWN_S)
    during = watch.between(killed, time.monotonic())
    assert len(during) >= 3 and all(poll.status is not None for poll in during), [p.error for p in during]
    after = [poll for poll in during if poll.at >= seen]
    assert after and all(poll.status == 503 and poll.body["status"] == "unavailable" for poll in after)

    # The worker back on its port: the same server process restarts itself and answers.
    with pinned(1):
        back = start_worker(port)
    try:
        restarted = time.monotonic()
        wait_healthy(url, server, log, BACK_S)
        answer = chat(url, "Say hello.", 8, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        # The same process, its command line run again in place (exec), still the supervisor's child.
        assert server.poll() is None and children(server.pid) == serving
        text = log.read_text()
        assert "answer again: restarting" in text and text.count("edgespec serve: ready") == 2, text
        # No client was turned away while it restarted: the socket never stopped listening.
        refused_polls = [p for p in watch.between(restarted, time.monotonic()) if "ConnectError" in p.error]
        assert not refused_polls, refused_polls
    finally:
        back.kill()
        back.wait()
    # Stopped with its worker gone: it does not wait on the worker (closing the pair would).
    server.send_signal(signal.SIGTERM)
    assert server.wait(STOP_S) == 0
