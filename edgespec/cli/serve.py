"""``edgespec serve``: the OpenAI-compatible server on one loaded model pair.

The port is bound first (a taken port is one line and exit code 2, before gigabytes are
loaded), uvicorn starts serving at once with ``/health`` answering 503 "loading", and the
pair and its cost profile load in a background thread. With ``--ui`` the chat app is
mounted at "/" on the same engine; it needs the loaded pair to build its page, so then the
pair is loaded before the port opens.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import threading

from edgespec.api import EdgeSpec
from edgespec.cli.generate import add_model_flags, runtime_options
from edgespec.errors import EdgespecError

DEFAULT_HOST = "127.0.0.1"  # loopback: reachable from this machine only
DEFAULT_PORT = 8080
DEFAULT_MAX_QUEUE = 8


def add_parser(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="serve the model pair over an OpenAI-compatible HTTP API")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    serve.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help=f"requests that may wait for the engine; more get 503 (default {DEFAULT_MAX_QUEUE})",
    )
    serve.add_argument("--ui", action="store_true", help="also serve the chat app at / on the same engine")
    add_model_flags(serve)
    serve.set_defaults(handler=run_serve)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one line saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise EdgespecError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise EdgespecError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def load(args: argparse.Namespace) -> EdgeSpec:
    lm = EdgeSpec(args.target, None if args.draft in ("", "none") else args.draft, runtime_options(args))
    # Measured (or read from disk) now, so that /health turns 200 only when the first
    # "auto" answer will not wait for it.
    lm.controller_state()
    return lm


def run_serve(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        raise EdgespecError(f"port must be in 1..65535 (got {args.port})")
    if args.ctx < 16:
        raise EdgespecError(f"context length must be at least 16 tokens (got {args.ctx})")
    if args.max_queue < 0:
        raise EdgespecError(f"--max-queue must be >= 0 (got {args.max_queue})")
    if args.threads is not None and args.threads < 1:
        raise EdgespecError(f"threads must be >= 1 (got {args.threads})")
    if not args.api_key and not is_loopback(args.host):
        print(f"edgespec: warning: serving on {args.host} without --api-key: anyone who can reach "
              "this address can use the model", file=sys.stderr)  # fmt: skip

    import uvicorn

    from edgespec.server.app import ServerState, add_api_fallback, create_app

    sock = bind(args.host, args.port)
    state = ServerState(api_key=args.api_key or None, max_queue=args.max_queue)
    app = create_app(state)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{args.port}"
    lm: EdgeSpec | None = None
    if args.ui:
        import gradio

        from edgespec.ui.layout import build_app

        try:
            lm = load(args)
        except BaseException:
            sock.close()
            raise
        state.attach(lm, shared=True)
        # After the API routes, so that "/" catches only what they do not.
        add_api_fallback(app)
        gradio.mount_gradio_app(app, build_app(lm).queue(), path="/")
        print(f"edgespec serve: chat app at {url}/", file=sys.stderr, flush=True)

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            # An open stream must not hold the shutdown: after this, its task is cancelled,
            # which cancels its generation.
            timeout_graceful_shutdown=3,
        )
    )
    failure: list[str] = []

    def load_in_background() -> None:
        nonlocal lm
        try:
            lm = load(args)
        except EdgespecError as exc:
            failure.append(str(exc))
        except Exception as exc:
            failure.append(f"loading failed: {type(exc).__name__}: {exc}")
        if failure:
            state.load_error = failure[0]
            server.should_exit = True
            return
        state.attach(lm)
        print(f"edgespec serve: ready, {lm.target.name} + {lm.draft.name if lm.draft else 'no draft'}",
              file=sys.stderr, flush=True)  # fmt: skip

    print(f"edgespec serve: {url}/v1  (health: {url}/health, Ctrl-C to stop)", file=sys.stderr, flush=True)
    if lm is None:
        threading.Thread(target=load_in_background, name="edgespec-load", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        # Free llama.cpp only once no generation can touch it any more; a worker stuck
        # past the timeout is left to the process exit instead of a use-after-free.
        idle = state.queue.shutdown() if state.queue is not None else True
        if lm is not None and idle:
            lm.close()
    if failure:
        raise EdgespecError(failure[0])
    return 0
