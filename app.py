"""Start the edgespec chat app: ``python app.py [--host H] [--port P] [--target T] [--draft D] [--ctx N]``.

The model pair is loaded once, before the server starts, and shared by every session. A
pair that cannot be loaded is reported as one line and exit code 2, like the CLI.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

DEFAULT_HOST = "127.0.0.1"  # loopback: the app is reachable from this machine only
DEFAULT_PORT = 7860


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The edgespec chat app (Gradio).")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--target", default="default", help="catalog name or GGUF path of the target model")
    parser.add_argument("--draft", default="default", help="catalog name or GGUF path of the draft model")
    parser.add_argument("--ctx", type=int, default=0,
                        help="context length in tokens (default 0: what the model was trained for, "
                             "bounded by this machine's memory)")  # fmt: skip
    return parser.parse_args(argv)


def load_pair(args: argparse.Namespace) -> EdgeSpec:
    """The shared EdgeSpec; raises EdgespecError with a one-line reason."""
    from edgespec.api import EdgeSpec, RuntimeOptions
    from edgespec.errors import EdgespecError

    if args.ctx != 0 and args.ctx < 16:
        raise EdgespecError(f"--ctx must be at least 16, or 0 for the model's own (got {args.ctx})")
    from edgespec.cli.generate import default_cache_gib
    from edgespec.runtime.prompt_cache import GIB, CacheOptions

    # Idle chats' KV states stay in memory, so a chat taken up again reads only its new turn.
    cache = CacheOptions(ram_bytes=int(default_cache_gib() * GIB))
    # Gradio runs each event in a thread of its own: the models' calls all go to one.
    options = RuntimeOptions(n_ctx=args.ctx, cache=cache, engine_thread=True)
    lm = EdgeSpec(target=args.target, draft=args.draft, options=options)
    # Measure drafting and verification costs now (or load them from an earlier run), so
    # that the first answer with drafter "auto" does not wait for it.
    lm.controller_state()
    return lm


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Heavy imports wait until needed: --help is instant, and a bad model path fails
    # before Gradio is even imported.
    from edgespec.errors import run_reporting_errors

    loaded: list[EdgeSpec] = []
    status = run_reporting_errors(lambda: loaded.append(load_pair(args)))
    if not loaded:
        return status
    lm = loaded[0]

    from edgespec.ui.layout import build_app, launch_app

    demo = build_app(lm)
    try:
        launch_app(demo, server_name=args.host, server_port=args.port, prevent_thread_lock=True, quiet=True)
    except OSError as exc:  # typically: the port is taken
        print(f"edgespec: error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"edgespec chat: {demo.local_url}  (Ctrl-C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        demo.close()
        lm.close()
    return 0


if __name__ == "__main__":
    # The app runs in a supervised child: a crash inside llama.cpp becomes one line naming
    # what crashed, instead of a server that silently vanishes.
    from edgespec import crashguard

    if crashguard.is_child():
        crashguard.arm()
        sys.exit(main())
    sys.exit(crashguard.supervise([sys.executable, __file__, *sys.argv[1:]], program="edgespec"))
