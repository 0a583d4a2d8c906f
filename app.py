"""Start the edgespec chat app: ``python app.py [--host H] [--port P] [--target T] [--draft D] [--ctx N]
[--models-dir DIR …]``.

The model pair is loaded once, before the server starts, and shared by every session. A
pair that cannot be loaded is reported as one line and exit code 2, like the CLI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.cli.rpc_flags import add_rpc_flags

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec
    from edgespec.ui.pair import PairChoice

DEFAULT_HOST = "127.0.0.1"  # loopback: the app is reachable from this machine only
DEFAULT_PORT = 7860
DEFAULT_DISK_GIB = 4.0  # a laptop's share: some 140k tokens of the default 1.5B's states


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The edgespec chat app (Gradio).")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--target", default="default", help="catalog name or GGUF path of the target model")
    parser.add_argument("--draft", default="default", help="catalog name or GGUF path of the draft model")
    parser.add_argument("--ctx", type=int, default=0,
                        help="context length in tokens (default 0: what the model was trained for, "
                             "bounded by this machine's memory)")  # fmt: skip
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the chats are kept (default: this platform's user data folder, "
                             "or EDGESPEC_DATA_DIR)")  # fmt: skip
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where chats' prompt states are kept on disk, so a chat reopened after a "
                             "restart answers warm (default: EDGESPEC_HOME/prompt-cache)")  # fmt: skip
    parser.add_argument("--cache-disk-gib", type=float, default=DEFAULT_DISK_GIB,
                        help=f"the most those states may take on disk, least recently used removed "
                             f"first (default {DEFAULT_DISK_GIB:g}; 0: memory only)")  # fmt: skip
    parser.add_argument("--models-dir", type=Path, action="append", default=None, metavar="DIR",
                        help="a folder of GGUF files for the model picker to offer, beside LM Studio's, "
                             "Ollama's, Jan's, the Hugging Face cache and llama.cpp's cache "
                             "(repeatable; used where they are, never copied)")  # fmt: skip
    parser.add_argument("--attachment-limit-mb", type=float, default=None, metavar="MB",
                        help="the largest file a message may attach, in MB (default 32; kept "
                             "in the chat store)")  # fmt: skip
    add_rpc_flags(parser)
    args = parser.parse_args(argv)
    if args.attachment_limit_mb is not None and args.attachment_limit_mb <= 0:
        parser.error(f"--attachment-limit-mb must be above 0 (got {args.attachment_limit_mb:g})")
    for folder in args.models_dir or ():
        if not folder.expanduser().is_dir():
            parser.error(f"--models-dir {folder}: not a folder")
    return args


def load_pair(args: argparse.Namespace, choice: PairChoice | None = None) -> EdgeSpec:
    """The shared EdgeSpec (``choice``: another pair than the flags name, picked in the
    app); raises EdgespecError with a one-line reason."""
    from edgespec.api import EdgeSpec, RuntimeOptions
    from edgespec.errors import EdgespecError

    if args.ctx != 0 and args.ctx < 16:
        raise EdgespecError(f"--ctx must be at least 16, or 0 for the model's own (got {args.ctx})")
    from edgespec.cli.generate import default_cache_gib, rpc_options
    from edgespec.host import home
    from edgespec.runtime.prompt_cache import GIB, CacheOptions

    # Idle chats' KV states stay in memory, so a chat taken up again reads only its new
    # turn, and on disk, so that it still does after a restart.
    disk = int(args.cache_disk_gib * GIB)
    directory = (args.cache_dir or home() / "prompt-cache") if disk > 0 else None
    cache = CacheOptions(
        ram_bytes=int(default_cache_gib() * GIB), directory=directory, disk_bytes=max(disk, 1)
    )
    # Gradio runs each event in a thread of its own: the models' calls all go to one.
    endpoints, split = rpc_options(args)
    options = RuntimeOptions(
        n_ctx=args.ctx, cache=cache, engine_thread=True, rpc=endpoints, tensor_split=split
    )
    target, draft = (choice.target, choice.draft) if choice is not None else (args.target, args.draft)
    lm = EdgeSpec(target=target, draft=draft, options=options)
    # Measure drafting and verification costs now (or load them from an earlier run), so
    # that the first answer with drafter "auto" does not wait for it.
    lm.controller_state()
    return lm


def open_store(args: argparse.Namespace):
    """The chats' store (a file that cannot be read is set aside: the store says so)."""
    from edgespec.ui.chat_store import ChatStore, default_data_dir

    store = ChatStore.open(args.data_dir or default_data_dir())
    if args.attachment_limit_mb is not None:
        store.set_attachment_limit(int(args.attachment_limit_mb * 1_000_000))
    return store


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Heavy imports wait until needed: --help is instant, and a bad model path fails
    # before Gradio is even imported.
    from edgespec.errors import run_reporting_errors

    loaded: list = []
    status = run_reporting_errors(lambda: loaded.extend((load_pair(args), open_store(args))))
    if len(loaded) < 2:
        if loaded:
            loaded[0].close()
        return status
    lm, store = loaded

    from edgespec.ui.layout import build_app, launch_app
    from edgespec.ui.pair import PairChoice

    demo = build_app(
        lm, store=store, loader=lambda choice: load_pair(args, choice), models_dirs=args.models_dir
    )
    demo.pair.loaded_as(PairChoice(args.target, args.draft))  # type: ignore[attr-defined]
    if store.notice:
        print(f"edgespec: {store.notice}", file=sys.stderr, flush=True)
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
        # The pair answering now: the one loaded at start, or one picked in the app since.
        current = demo.pair.lm  # type: ignore[attr-defined]
        if current is not None:
            current.close()
        store.close()
    return 0


if __name__ == "__main__":
    # The app runs in a supervised child: a crash inside llama.cpp becomes one line naming
    # what crashed, instead of a server that silently vanishes.
    from edgespec import crashguard

    if crashguard.is_child():
        crashguard.arm()
        sys.exit(main())
    sys.exit(crashguard.supervise([sys.executable, __file__, *sys.argv[1:]], program="edgespec"))
