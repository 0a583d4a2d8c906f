"""A worker lost while a target split over machines is loaded (``runtime/rpc.py``).

ggml-rpc has no error path: a worker that dies, or a connection that fails, ends in
GGML_ABORT on ggml-rpc's own dispatch thread. ggml hands the message to its abort callback
(``ggml_set_abort_callback``, libggml-base) and calls abort() when the callback returns, so:

* ``guard_aborts`` routes ggml's aborts here; one from ggml-rpc calls ``on_worker_lost``,
  by default one line naming the workers and exit code 2 (instead of ggml's backtrace,
  which it prints by starting gdb where gdb is installed, and SIGABRT). A server calls
  ``park_on_loss`` instead: its handler runs once, and every thread ggml aborts on then
  waits for good, so the process lives on (the pass that waited on that thread never
  ends, and the model cannot be used or loaded again in this process, because ggml-rpc
  keeps that connection per address: the server restarts itself once the workers are
  back, ``cli/serve_restart.py``);
* a worker that stops answering (stopped, or cut off without a reset) makes no abort at
  all: a receive waits for good. ``bound_stalls`` gives ggml-rpc's connections a time
  limit on every send and receive (ggml-rpc has no setting: its sockets are found among
  this process's descriptors by their peer), after which the receive fails and the abort
  above follows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import sys
import threading
from collections.abc import Callable, Iterable

from edgespec.runtime import devices

# The longest a loaded target waits on one reply of a worker. A reply covers the worker's
# share of one decode (a prompt's batch at most), which a working machine computes well
# within this; a worker silent longer has stopped, and the answer ends with an error. Below
# half a minute: the client of a stalled worker hears of it within that, the wait for the
# reply and the pass's other round trips together.
STALL_S = 25.0

_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_guard: list = []  # the installed callback, kept alive for as long as ggml may call it
_workers: set[str] = set()  # every worker a model of this process was placed on


def _worker_lost(reason: str) -> None:
    """The default: one line naming the workers, exit code 2 (what a user error is)."""
    workers = ", ".join(sorted(_workers)) or "a worker"
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        line = (
            f"lost the connection to {workers}: the worker died, stopped or was cut off for {STALL_S:g} s "
            f"({reason}); check it and run again"
        )
        print(f"\nedgespec: error: {line}", file=sys.stderr, flush=True)
    os._exit(2)


# Called on ggml-rpc's thread with ggml's reason; if it returns, ggml aborts the process.
on_worker_lost: Callable[[str], None] = _worker_lost


def park_on_loss(lost: Callable[[str], None]) -> None:
    """A lost worker does not end the process: ``lost(reason)`` runs once, on the first
    thread ggml aborts on, and that thread, as every later one, then waits for good (ggml
    calls abort() as soon as the handler returns)."""
    global on_worker_lost
    first = threading.Lock()

    def park(reason: str) -> None:
        if first.acquire(blocking=False):
            try:
                lost(reason)
            except Exception as exc:  # the thread must park whatever happened
                with contextlib.suppress(Exception):
                    print(f"edgespec: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        threading.Event().wait()

    on_worker_lost = park


def workers() -> tuple[str, ...]:
    """Every worker a model of this process was placed on."""
    return tuple(sorted(_workers))


def cut(peers: Iterable[tuple[str, int]]) -> int:
    """Shut down this process's connections to ``peers`` ((host, port)); how many there
    were. Once a worker is lost its connection is dead weight: a worker that only stalled
    still serves it (one client at a time) and would never answer anyone else."""
    found = 0
    for sock in connections(peers):
        with sock, contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
            found += 1
    return found


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", errors="replace").strip()
    if "ggml-rpc" not in text:
        # Any other abort ends the process as before (the supervisor names the crash); the
        # message ggml would have printed itself is printed here.
        with contextlib.suppress(Exception):
            print(text, file=sys.stderr, flush=True)
        return
    on_worker_lost(text.rsplit(": ", 1)[-1])


def guard_aborts(endpoints: Iterable[str]) -> None:
    """Route ggml's aborts through ``_on_abort`` (installed once per process), naming
    ``endpoints`` among the workers a lost connection may be to."""
    _workers.update(endpoints)
    if _guard:
        return
    base = devices.open_library("ggml-base")
    if base is None or not hasattr(base, "ggml_set_abort_callback"):
        return
    callback = _ABORT_CALLBACK(_on_abort)
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback.argtypes = [_ABORT_CALLBACK]
    base.ggml_set_abort_callback(callback)
    _guard.append(callback)


def bound_stalls(peers: Iterable[tuple[str, int]], seconds: float = STALL_S) -> int:
    """A time limit of ``seconds`` on every send and receive of this process's connections
    to ``peers`` ((host, port)); how many there were (0 where descriptors cannot be listed)."""
    limit = struct.pack("@ll", int(seconds), int((seconds % 1) * 1e6))
    found = 0
    for sock in connections(peers):
        with sock, contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
            found += 1
    return found


def connections(peers: Iterable[tuple[str, int]]) -> list[socket.socket]:
    """This process's open TCP connections to ``peers`` ((host or address, port)), each as
    a socket over a duplicate of its descriptor: options set on it are the connection's;
    closing it leaves the connection open."""
    addresses = set()
    for host, port in peers:
        with contextlib.suppress(OSError):
            addresses.update((info[4][0], port) for info in socket.getaddrinfo(host, port, socket.AF_INET))
    found = []
    for fd in descriptors():
        try:
            copy = os.dup(fd)
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:  # not a socket
            os.close(copy)
            continue
        try:
            ours = sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
            ours = ours and sock.getpeername() in addresses
        except OSError:
            ours = False
        if ours:
            found.append(sock)
        else:
            sock.close()
    return found


def descriptors() -> list[int]:
    """This process's open file descriptors (empty where they cannot be listed)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return [int(name) for name in os.listdir(folder) if name.isdigit()]
    return []
