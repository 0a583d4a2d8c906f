"""Progress bars for long work (downloads, assembly, hashing, cost measurement), on stderr."""

from __future__ import annotations

import sys

from tqdm import tqdm


def byte_bar(description: str, total: int | None) -> tqdm:
    """A bytes progress bar; on a non-terminal (CI logs) it redraws rarely."""
    interactive = sys.stderr.isatty()
    return tqdm(
        total=total or None,
        desc=description,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        mininterval=0.2 if interactive else 10.0,
        leave=True,
        dynamic_ncols=interactive,
    )


def count_bar(description: str, total: int) -> tqdm:
    """A progress bar over ``total`` steps of work."""
    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=description,
        file=sys.stderr,
        mininterval=0.2 if interactive else 10.0,
        leave=False,
        dynamic_ncols=interactive,
    )
