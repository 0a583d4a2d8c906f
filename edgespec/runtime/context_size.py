"""The context a model gets when none is asked for: what it was trained for, bounded by
the memory its KV cache may take on this machine."""

from __future__ import annotations

from edgespec.models.recommend import total_memory_bytes

# The KV cache of one model may take this share of the machine's memory by default (a
# pair: twice that), so a default context never pushes the weights out of memory.
KV_MEMORY_SHARE = 1 / 8
FALLBACK_CONTEXT = 4096  # for a model that does not say what it was trained for


def default_context(n_ctx_train: int, kv_per_token: int, memory: int | None = None) -> int:
    """The trained context, bounded by ``KV_MEMORY_SHARE`` of ``memory`` (this machine's,
    by default), in whole 256-token blocks and never under 2,048."""
    trained = n_ctx_train if n_ctx_train > 0 else FALLBACK_CONTEXT
    memory = total_memory_bytes() if memory is None else memory
    if memory <= 0 or kv_per_token <= 0:
        return trained
    fits = int(memory * KV_MEMORY_SHARE // kv_per_token) // 256 * 256
    return min(trained, max(fits, 2048))
