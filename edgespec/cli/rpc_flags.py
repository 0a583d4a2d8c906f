"""``--rpc`` and ``--tensor-split``, the flags every command that loads a pair takes. Kept
apart from the commands (standard library only), so that ``app.py --help`` stays instant."""

from __future__ import annotations


def add_rpc_flags(group) -> None:
    """``--rpc`` and ``--tensor-split``: the target split over this machine and workers."""
    group.add_argument("--rpc", default=None, metavar="HOST:PORT[,...]",
                       help="split the target over this machine and these workers (run `edgespec "
                            "worker` on each); the draft model stays here")  # fmt: skip
    group.add_argument("--tensor-split", default=None, metavar="P0,P1,...",
                       help="with --rpc: the target's layers in these proportions, this machine's "
                            "first, then each worker's device (default: by free memory)")  # fmt: skip
