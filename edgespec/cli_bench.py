"""``edgespec bench``: speculative configurations against target-only, side by side."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmark drafters against target-only decoding")
    bench.set_defaults(handler=lambda args: 0)
