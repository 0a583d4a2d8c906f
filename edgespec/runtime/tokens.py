"""Token lists compared."""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int], limit: int | None = None) -> int:
    """Length of the common prefix of two token lists (at most ``limit``). The usual case,
    a cache that is a prefix of the context, is one C-level list comparison."""
    n = min(len(a), len(b), len(b) if limit is None else limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # the first difference lies in [lo, hi): halve with slice compares
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
