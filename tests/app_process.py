"""The chat app as a person runs it: ``app.py`` in a process of its own, on a free
loopback port, over chats and prompt states kept in folders the test owns; stopped with
Ctrl-C (SIGINT), as a person closes it, and started again on the same folders."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app.py"
START_TIMEOUT_S = 600  # loading the pair, and measuring costs where none were measured yet


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AppProcess:
    """One run of ``app.py`` over ``data`` (chats) and ``cache`` (prompt states)."""

    def __init__(self, data: Path, cache: Path, *extra: str, env: dict[str, str] | None = None):
        self.data, self.cache, self.extra, self.env = data, cache, extra, env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = data.parent / f"app-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> AppProcess:
        command = [sys.executable, str(APP), "--port", str(self.port), "--ctx", "2048",
                   "--data-dir", str(self.data), "--cache-dir", str(self.cache), *self.extra]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the app exited ({self.process.returncode}): {self.output()[-2000:]}")
            try:
                if httpx.get(self.url, timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the app did not start: {self.output()[-2000:]}")

    def stop(self) -> None:
        """Ctrl-C, as a person stops it: the pair is closed, its prompt states written."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the app did not stop on Ctrl-C: {self.output()[-2000:]}") from None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
