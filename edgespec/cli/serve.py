"""``edgespec serve``: the OpenAI-compatible server on one loaded model pair.

The port is bound first (a taken port is one line and exit code 2, before gigabytes are
loaded), uvicorn starts serving at once with ``/health`` answering 503 "loading", and the
pair and its cost profile load in a background thread. With ``--ui`` the chat app is
mounted at "/" on the same engine; it needs the loaded pair to build its page, so then the
pair is loaded before the port opens. With ``--rpc``, a worker lost while serving makes the
target unavailable (503) until the worker is back; then the process restarts itself on the
same listening socket (``serve_restart.py``).
"""

from __future__ import annotations

import argparse
import ipaddress
import secrets
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.api import EdgeSpec
from edgespec.cli.generate import add_model_flags, cache_options, check_ctx, rpc_options, runtime_options
from edgespec.errors import EdgespecError
from edgespec.models.resolve import resolve
from edgespec.runtime import rpc

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from edgespec.cli.serve_restart import Recovery
    from edgespec.server.app import ServerState

DEFAULT_HOST = "127.0.0.1"  # loopback: reachable from this machine only
DEFAULT_PORT = 8080
DEFAULT_MAX_QUEUE = 8
DEFAULT_PARALLEL = 4  # as llama-server: a chat and an agent's side requests at once


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
    serve.add_argument(
        "--parallel",
        type=int,
        default=DEFAULT_PARALLEL,
        help=f"answers decoding at once, each in a slot with its own context (default {DEFAULT_PARALLEL})",
    )
    serve.add_argument("--ui", action="store_true", help="also serve the chat app at / on the same engine")
    serve.add_argument("--data-dir", type=Path, default=None,
                       help="with --ui: where the app's chats are kept (default: this platform's user "
                            "data folder, or EDGESPEC_DATA_DIR)")  # fmt: skip
    serve.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file to use instead of the one inside the target's GGUF",
    )
    serve.add_argument(
        "--embedding-model",
        default=None,
        metavar="REF",
        help="a model for /v1/embeddings (a catalog name, a path, a hub reference); default: the target",
    )
    serve.add_argument(
        "--cors",
        default="",
        metavar="ORIGINS",
        help="let web pages from these origins call the API (comma-separated, or '*' for any)",
    )
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
    draft = None if args.draft in ("", "none") else args.draft
    lm = EdgeSpec(args.target, draft, runtime_options(args, serving=True, parallel=args.parallel))
    if args.chat_template:
        lm.target.template_override = read_template(args.chat_template)
    # Measured (or read from disk) now, so that /health turns 200 only when the first
    # "auto" answer will not wait for it.
    lm.controller_state()
    return lm


def run_serve(args: argparse.Namespace) -> int:
    check_args(args)

    from edgespec.cli import serve_restart
    from edgespec.server.app import ServerState, create_app

    # After a restart (a lost worker back): the socket that listened before, never closed.
    sock = serve_restart.adopt(args.port) or bind(args.host, args.port)
    state = ServerState(api_key=args.api_key or None, max_queue=args.max_queue)
    recovery = serve_restart.watch(state, rpc.parse_endpoints(args.rpc), sock) if args.rpc else None
    embedder = resolve(args.embedding_model).path if args.embedding_model else None
    app = create_app(state, cors_origins(args.cors), embedder)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{args.port}"
    loaded: list[EdgeSpec] = []  # the pair, once loaded (the app needs it before serving)
    if args.ui:
        loaded.append(mount_chat_app(app, state, args, sock, url))

    server = _uvicorn_server(app)
    if recovery is not None:
        recovery.server = server
    failure: list[str] = []
    print(f"edgespec serve: {url}/v1  (health: {url}/health, Ctrl-C to stop)", file=sys.stderr, flush=True)
    if not loaded:
        threading.Thread(
            target=load_in_background,
            args=(args, state, server, loaded, failure),
            name="edgespec-load",
            daemon=True,
        ).start()
    _end_on_sigterm()
    try:
        server.run(sockets=[sock])
    finally:
        _shut_down(app, state, sock, recovery, loaded)
    if failure:
        raise EdgespecError(failure[0])
    return 0


def _uvicorn_server(app: FastAPI) -> uvicorn.Server:
    """uvicorn on ``app``, quiet: run_serve says in one line where it serves."""
    import uvicorn

    return uvicorn.Server(
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


def _shut_down(
    app: FastAPI,
    state: ServerState,
    sock: socket.socket,
    recovery: Recovery | None,
    loaded: list[EdgeSpec],
) -> None:
    """Once the server has stopped: the socket closed, then the engine, then the pair."""
    from edgespec.cli import serve_restart

    if recovery is not None:
        recovery.stopping = True
    if state.unavailable:
        serve_restart.leave_now()
    sock.close()
    # Free llama.cpp only once no generation can touch it any more; a worker stuck
    # past the timeout is left to the process exit instead of a use-after-free.
    idle = True
    if state.lm is not None:
        state.lm.stop_answers()
        idle = state.lm.wait_idle(SHUTDOWN_S)
    # The embedding context borrows the target's weights: it goes before them.
    app.state.embeddings.close()
    if loaded and idle:
        loaded[0].close()


# Seconds the answers stopped at shutdown have to give their slots back.
SHUTDOWN_S = 10.0


def _end_on_sigterm() -> None:
    """uvicorn shuts down gracefully on SIGTERM and then raises the signal again with the
    handler it found: the default one would kill the process before the pair is closed,
    and the prompt cache would keep nothing of the slots on disk. This one ends it as an
    exit does, through the ``finally`` that closes the pair."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def check_args(args: argparse.Namespace) -> None:
    """One line for a flag out of range; a warning for a public address without a key."""
    if not 1 <= args.port <= 65535:
        raise EdgespecError(f"port must be in 1..65535 (got {args.port})")
    check_ctx(args.ctx)
    cache_options(args, serving=True)  # a bad --cache-ram or --cache-dir, before loading
    rpc_options(args)  # a worker that is down: the server refuses to start
    cors_origins(args.cors)
    if args.chat_template:
        read_template(args.chat_template)
    if not 1 <= args.parallel <= 64:
        raise EdgespecError(f"--parallel must be in 1..64 (got {args.parallel})")
    if args.max_queue < 0:
        raise EdgespecError(f"--max-queue must be >= 0 (got {args.max_queue})")
    if args.threads is not None and args.threads < 1:
        raise EdgespecError(f"threads must be >= 1 (got {args.threads})")
    if not args.api_key and not is_loopback(args.host):
        print(f"edgespec: warning: serving on {args.host} without --api-key: anyone who can reach "
              "this address can use the model", file=sys.stderr)  # fmt: skip


def read_template(path: str) -> str:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgespecError(f"cannot read the chat template {path}: {exc}") from None
    if not text.strip():
        raise EdgespecError(f"the chat template {path} is empty")
    return text


def cors_origins(value: str) -> list[str]:
    """``--cors``: the origins a browser may call the API from ('*': any)."""
    origins = [origin.strip().rstrip("/") for origin in value.split(",") if origin.strip()]
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise EdgespecError(f"--cors takes origins like http://localhost:3000 or '*' (got {origin!r})")
    return origins


def mount_chat_app(
    app: FastAPI, state: ServerState, args: argparse.Namespace, sock: socket.socket, url: str
) -> EdgeSpec:
    """``--ui``: the pair loaded now (the app's page needs it; the socket is closed if it
    cannot load), and the chat app mounted at "/" on the same engine."""
    import gradio

    from edgespec.server.app import add_api_fallback
    from edgespec.ui.layout import build_app, calm_queue
    from edgespec.ui.live import HeadScript

    try:
        lm = load(args)
    except BaseException:
        sock.close()
        raise
    state.attach(lm)
    # After the API routes, so that "/" catches only what they do not.
    add_api_fallback(app)
    from edgespec.ui.chat_store import ChatStore, default_data_dir

    store = ChatStore.open(args.data_dir or default_data_dir())
    if store.notice:
        print(f"edgespec: {store.notice}", file=sys.stderr, flush=True)
    demo = build_app(lm, store=store)
    app.include_router(demo.live_feeds.router())  # the page's live feed, before "/" takes the rest
    app.add_middleware(HeadScript)
    # One local user: with --api-key the page asks for the key (as its password) first.
    key = args.api_key
    auth = (lambda _user, password: secrets.compare_digest(password, key)) if key else None
    gradio.mount_gradio_app(
        app, calm_queue(demo.queue()), path="/", auth=auth,
        auth_message="This server needs its API key: type it as the password (any user name).",
    )  # fmt: skip
    print(f"edgespec serve: chat app at {url}/", file=sys.stderr, flush=True)
    return lm


def load_in_background(
    args: argparse.Namespace,
    state: ServerState,
    server: uvicorn.Server,
    loaded: list[EdgeSpec],
    failure: list[str],
) -> None:
    """The pair loaded while the server already answers ``/health`` with "loading": on
    success appended to ``loaded`` and attached to ``state``; on failure its one line
    appended to ``failure``, kept for ``/health``, and the server told to stop."""
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
    loaded.append(lm)
    state.attach(lm)
    split = f" ({lm.target.placement.describe()})" if lm.target.placement is not None else ""
    print(f"edgespec serve: ready, {lm.target.name}{split} + {lm.draft.name if lm.draft else 'no draft'}"
          f"{cache_line(lm)}", file=sys.stderr, flush=True)  # fmt: skip


def cache_line(lm: EdgeSpec) -> str:
    if lm.prompt_cache is None:
        return ", no prompt cache"
    facts = lm.prompt_cache.describe()
    where = f" and {facts['directory']}" if facts["directory"] else ""
    return f", prompt cache {facts['ram_gib']} GiB in memory{where} ({facts['states']} states)"
