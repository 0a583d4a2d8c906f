"""``edgespec worker``: serve this machine's devices to an edgespec on another machine.

The other machine loads its target with ``--rpc HOST:PORT`` and puts part of the layers
here (``runtime/rpc.py``). This is llama.cpp's own RPC server, from the library edgespec
already loaded; it serves one client at a time. Its protocol has no authentication and
no encryption, so it listens on loopback unless told otherwise, and says so once when told.

The server's C call blocks for good, so it runs on a daemon thread while the main thread
waits in a way a signal interrupts: Ctrl-C ends the process with one line (exit 130).
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import sys
import threading
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.runtime import rpc, system

DEFAULT_HOST = "127.0.0.1"


def add_parser(subparsers) -> None:
    worker = subparsers.add_parser(
        "worker",
        help="serve this machine's CPU or GPU to another edgespec (a target split with --rpc)",
        description="Serve this machine's devices to an edgespec that loads its target with "
        "--rpc HOST:PORT (llama.cpp's RPC backend). The protocol has no authentication: keep "
        "the port on a network you trust.",
    )
    worker.add_argument("--host", default=DEFAULT_HOST,
                        help=f"IPv4 address to listen on (default {DEFAULT_HOST}: this machine only; "
                             "0.0.0.0: every interface)")  # fmt: skip
    worker.add_argument(
        "--port", type=int, default=rpc.DEFAULT_PORT, help=f"port (default {rpc.DEFAULT_PORT})"
    )
    worker.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    worker.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="keep the large tensors clients send here, so a client loading the "
                             "same model again sends only their hashes")  # fmt: skip
    worker.set_defaults(handler=run)


def listen_address(host: str) -> str:
    """The IPv4 address llama.cpp's server binds (it takes no host names or IPv6)."""
    host = "127.0.0.1" if host == "localhost" else host
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        raise EdgespecError(
            f"--host takes an IPv4 address such as 127.0.0.1 or 0.0.0.0 (got {host!r})"
        ) from None


def check_port_free(host: str, port: int) -> None:
    """Bind and let go, as llama.cpp's server will bind (SO_REUSEADDR): a taken port is one
    line now, not a silent return of the C call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise EdgespecError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def _cache_dir(value: str | None) -> str | None:
    if value is None:
        return None
    directory = Path(value).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgespecError(f"--cache-dir: cannot make {directory}: {exc.strerror}") from None
    return str(directory.resolve())


def run(args: argparse.Namespace) -> int:
    host = listen_address(args.host)
    if not 1 <= args.port <= 65535:
        raise EdgespecError(f"port must be in 1..65535 (got {args.port})")
    if args.threads is not None and args.threads < 1:
        raise EdgespecError(f"threads must be >= 1 (got {args.threads})")
    rpc.library()  # one line when this build has no RPC backend
    cache_dir = _cache_dir(args.cache_dir)
    check_port_free(host, args.port)
    if not ipaddress.IPv4Address(host).is_loopback:
        print(f"edgespec: warning: the worker listens on {host}:{args.port}, and llama.cpp's RPC protocol "
              "has no authentication or encryption: whoever reaches this port can use this machine's "
              "devices, read what they hold and may be able to run code here; keep it on a network you "
              "trust", file=sys.stderr, flush=True)  # fmt: skip
    served = rpc.served_devices()
    threads = args.threads or system.default_threads()
    names = ", ".join(f"{d.name} ({d.description})" for d in served)
    print(f"edgespec worker: serving {names} on {host}:{args.port}, {threads} threads "
          f"(Ctrl-C to stop)", file=sys.stderr, flush=True)  # fmt: skip
    endpoint = f"{host}:{args.port}"
    server = threading.Thread(
        target=rpc.serve, args=(endpoint, cache_dir, threads, served), name="edgespec-worker", daemon=True
    )
    server.start()
    try:
        while server.is_alive():
            server.join(0.5)  # a timed wait: the main thread takes Ctrl-C at once
    except KeyboardInterrupt:
        # A second interrupt (a signal sent to the whole process group as well) must not
        # land in the interpreter's shutdown as a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("edgespec worker: stopped", file=sys.stderr, flush=True)
        return 130
    raise EdgespecError(f"the worker stopped: llama.cpp could not listen on {endpoint} or accept a client")
