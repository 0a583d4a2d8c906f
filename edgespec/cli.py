"""The ``edgespec`` command: one entry point, one subcommand module per job.

Errors the user can fix print one line on stderr and exit with code 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import sys

from edgespec import __version__
from edgespec.errors import EdgespecError


def build_parser() -> argparse.ArgumentParser:
    from edgespec import cli_bench, cli_generate, cli_models

    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Exact speculative decoding for local GGUF models (llama.cpp).",
    )
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_generate.add_parsers(subparsers)
    cli_bench.add_parser(subparsers)
    cli_models.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args) or 0)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgespec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
