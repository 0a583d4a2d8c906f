"""The ``edgespec`` command: one entry point, one subcommand module per job.

Errors the user can fix print one line on stderr and exit with code 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import sys

from edgespec import __version__, crashguard
from edgespec.errors import EdgespecError, run_reporting_errors


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are bad input like any other: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise EdgespecError(f"{message} (see: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    from edgespec.cli import bench, costs, doctor, generate, models, serve, worker

    parser = _Parser(
        prog="edgespec",
        description="Exact speculative decoding for local GGUF models (llama.cpp).",
    )
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    generate.add_parsers(subparsers)
    bench.add_parser(subparsers)
    models.add_parser(subparsers)
    costs.add_parser(subparsers)
    doctor.add_parser(subparsers)
    serve.add_parser(subparsers)
    worker.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()

    def body() -> int:
        args = parser.parse_args(argv)
        return args.handler(args)

    return run_reporting_errors(body)


def entry(argv: list[str] | None = None) -> int:
    """The console script and ``python -m edgespec``: the command runs in a supervised child
    process, so that a crash inside llama.cpp is reported as one line, never silently."""
    if crashguard.is_child():
        crashguard.arm()
        return main(argv)
    args = sys.argv[1:] if argv is None else argv
    return crashguard.supervise([sys.executable, "-m", "edgespec", *args])


if __name__ == "__main__":
    sys.exit(entry())
