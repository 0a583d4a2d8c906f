"""``edgespec serve --rpc``: a worker lost while the server runs, and the server's way back.

A lost worker leaves the target unusable in this process for good (ggml-rpc keeps the dead
connection per address, and the pass that waited on it never ends: ``runtime/rpc_faults``),
so the server does not exit, nor load again in place:

* ``watch`` installs the handler: the server's state turns unavailable (every answer
  running or waiting ends at once with a 503 error, every model endpoint answers 503 with
  ``Retry-After``, ``/health`` names the lost worker), the dead connections are shut down
  (a worker that only stalled is then free for the next client), and a thread greets the
  workers every few seconds;
* once every worker answers, the process replaces itself with the same command line
  (``os.execv``), the listening socket kept open across it and named in ``ENV_LISTEN_FD``
  (``adopt`` takes it back): clients that connect meanwhile wait in its backlog, none is
  refused, and ``/health`` says "loading" until the pair is in again. Under the crash
  supervisor the process stays its child (same process, the supervisor's variables given
  back). Where the process cannot replace itself, it stays unavailable and says a restart
  is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from edgespec import crashguard
from edgespec.errors import EdgespecError
from edgespec.runtime import rpc, rpc_faults

if TYPE_CHECKING:
    import uvicorn

    from edgespec.server.app import ServerState

ENV_LISTEN_FD = "EDGESPEC_LISTEN_FD"
RECHECK_S = 2.0  # how often a lost worker is greeted
PROBE_S = 1.0  # the connection timeout of a greeting that decides whether a worker is back
QUIET_S = 5.0  # the longest a restart waits for the requests in flight


def adopt(port: int) -> socket.socket | None:
    """The listening socket a restart handed over (``ENV_LISTEN_FD``), if it listens on
    ``port``; None otherwise (the variable is taken out of the environment either way: the
    processes this one starts do not inherit it)."""
    value = os.environ.pop(ENV_LISTEN_FD, "")
    if not value.isdigit():
        return None
    try:
        sock = socket.socket(fileno=int(value))
    except OSError:
        return None
    accepts = getattr(socket, "SO_ACCEPTCONN", None)
    try:
        listening = accepts is None or sock.getsockopt(socket.SOL_SOCKET, accepts) == 1
        ours = listening and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port
    except OSError:
        ours = False
    if not ours:
        sock.close()
        return None
    sock.set_inheritable(True)
    return sock


@dataclass
class Recovery:
    """What a lost worker does to a server: ``state`` turns unavailable, and the process
    restarts on ``sock`` once every worker of ``endpoints`` answers again. ``server``: the
    uvicorn server, once made (a restart waits for its requests in flight)."""

    state: ServerState
    endpoints: tuple[str, ...]
    sock: socket.socket
    server: uvicorn.Server | None = None
    stopping: bool = False  # the server is stopping: closing the pair found the worker gone

    def lost(self, reason: str) -> None:
        """On ggml-rpc's thread, which waits for good afterwards."""
        if self.stopping:
            leave_now()
        down = lost_workers(self.endpoints)
        message = (
            f"lost the connection to {_named(down)}: {_plainly(reason)}; the server restarts once "
            f"{'it answers' if len(down) == 1 else 'they answer'} again"
        )
        ended = self.state.lose(message)
        rpc_faults.cut(rpc.check_endpoint(e) for e in self.endpoints)
        print(f"edgespec serve: error: {message} ({ended} answer(s) ended)", file=sys.stderr, flush=True)
        threading.Thread(target=self._wait_for_workers, name="edgespec-workers", daemon=True).start()

    def _wait_for_workers(self) -> None:
        while not all(answering(endpoint) for endpoint in self.endpoints):
            time.sleep(RECHECK_S)
        print("edgespec serve: the workers answer again: restarting", file=sys.stderr, flush=True)
        servers = getattr(self.server, "servers", None)
        if not servers:  # not serving yet (lost while the chat app's pair loaded)
            self.restart()
            return
        asyncio.run_coroutine_threadsafe(self._restart_when_quiet(), servers[0].get_loop())

    async def _restart_when_quiet(self) -> None:
        """On the event loop's thread: the requests in flight (a ``/health``) answered
        first, for a while at most; from the last check to the ``exec`` the loop accepts
        nothing (a client connecting meanwhile waits in the socket's backlog)."""
        assert self.server is not None
        deadline = time.monotonic() + QUIET_S
        while self.server.server_state.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.restart()

    def restart(self) -> None:
        """This process replaced by the same command line, ``sock`` (listening) kept open
        and named in ``ENV_LISTEN_FD``, nothing else: the dead connections to the workers,
        which ggml opens without close-on-exec, must not outlive it. Returns only when that
        fails, the state then saying a restart is needed."""
        env = {**os.environ, **crashguard.exec_environment(), ENV_LISTEN_FD: str(self.sock.fileno())}
        argv = [sys.executable, *sys.orig_argv[1:]]
        try:
            keep = {0, 1, 2, self.sock.fileno()}
            for fd in rpc_faults.descriptors():
                if fd not in keep:
                    with contextlib.suppress(OSError):  # (the listing's own descriptor, closed since)
                        os.set_inheritable(fd, False)
            os.set_inheritable(self.sock.fileno(), True)
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, argv, env)
        except OSError as exc:
            why = exc.strerror or str(exc)
            self.state.unavailable = (
                f"{self.state.unavailable}; the workers are back, but the server could not restart "
                f"itself ({why}): restart it"
            )
            print(
                f"edgespec serve: error: cannot restart ({why}): restart the server",
                file=sys.stderr,
                flush=True,
            )


def leave_now() -> NoReturn:
    """Out at once, the pair not closed: a server stopped while (or found, as it closed the
    pair, that) a worker is lost. Closing the pair, or the interpreter's own exit, frees
    its buffers on that worker through ggml-rpc, and the thread that tries waits for good."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def watch(state: ServerState, endpoints: tuple[str, ...], sock: socket.socket) -> Recovery:
    """From now on a lost worker makes ``state`` unavailable and, once every worker of
    ``endpoints`` answers again, restarts the server on ``sock``."""
    recovery = Recovery(state, endpoints, sock)
    rpc_faults.park_on_loss(recovery.lost)
    return recovery


def lost_workers(endpoints: tuple[str, ...]) -> tuple[str, ...]:
    """The workers that do not take a connection now; all of them when each does (one
    that stalled takes connections and answers none)."""
    down = []
    for endpoint in endpoints:
        try:
            socket.create_connection(rpc.check_endpoint(endpoint), timeout=PROBE_S).close()
        except OSError:
            down.append(endpoint)
    return tuple(down) or endpoints


def _named(endpoints: tuple[str, ...]) -> str:
    return ("worker " if len(endpoints) == 1 else "workers ") + ", ".join(endpoints)


def _plainly(reason: str) -> str:
    return (
        f"it died, stopped or was cut off for {rpc_faults.STALL_S:g} s "
        f"(ggml-rpc: {reason.strip().rstrip('.') or 'no reply'})"
    )


def answering(endpoint: str) -> bool:
    """Whether the worker takes a connection and answers the protocol's greeting now."""
    try:
        rpc.check_worker(endpoint, PROBE_S, fresh=True)
    except EdgespecError:
        return False
    return True
