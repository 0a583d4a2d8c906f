"""A radix tree over token-id sequences: which stored key shares the longest prefix with a
prompt, which key was used least recently, and how many bytes the stored values take.

It knows nothing of models: the prompt cache (``runtime.prompt_cache``) stores KV states
in it, keyed by the tokens they hold. Edges hold runs of tokens (a 2,000-token prompt is
one edge until another key branches off it), so a lookup costs one slice comparison per
branching point, not one step per token.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class Stored(Generic[V]):
    """One key's value, the bytes it is charged for, and when it was last used."""

    key: tuple[int, ...]
    value: V
    size: int
    used: int = 0


@dataclass
class _Node(Generic[V]):
    edge: tuple[int, ...] = ()  # the tokens between the parent and this node
    children: dict[int, _Node[V]] = field(default_factory=dict)
    stored: Stored[V] | None = None
    parent: _Node[V] | None = None


@dataclass(frozen=True)
class Match(Generic[V]):
    """The longest prefix a lookup shares with a stored key, and that key's entry."""

    length: int
    stored: Stored[V]


class PrefixTree(Generic[V]):
    """Keys (token tuples) to values, evicted least-recently-used beyond ``budget`` bytes."""

    def __init__(self, budget: int):
        if budget < 0:
            raise ValueError("the budget is a number of bytes, at least 0")
        self.budget = budget
        self.total = 0
        self._root: _Node[V] = _Node()
        self._nodes: dict[tuple[int, ...], _Node[V]] = {}  # the node of each stored key
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: Sequence[int]) -> bool:
        return tuple(key) in self._nodes

    def get(self, key: Sequence[int]) -> Stored[V] | None:
        """``key``'s own entry (not a prefix's), without marking it used."""
        node = self._nodes.get(tuple(key))
        return node.stored if node is not None else None

    def entries(self) -> list[Stored[V]]:
        """Every stored entry, least recently used first."""
        return sorted((node.stored for node in self._nodes.values() if node.stored), key=lambda s: s.used)

    # -- lookup -------------------------------------------------------------------------

    def match(self, key: Sequence[int]) -> Match[V] | None:
        """The stored key sharing the longest prefix with ``key`` (None when none shares a
        token). Among keys sharing as much, the shortest (cheapest to restore), then the
        most recently used. The entry is marked used."""
        node, depth = self._descend(tuple(key))
        if depth == 0:
            return None
        best = min(self._stored_under(node), key=lambda s: (len(s.key), -s.used))
        best.used = next(self._clock)
        return Match(depth, best)

    def shared(self, key: Sequence[int]) -> int:
        """How much of ``key`` the stored key sharing most of it shares (nothing is marked
        used: a look, not a use)."""
        return self._descend(tuple(key))[1]

    def _descend(self, key: tuple[int, ...]) -> tuple[_Node[V], int]:
        """The deepest node whose path shares the most of ``key``, and how much it shares
        (a node whose edge is matched only in part counts: its keys share that part)."""
        node, depth = self._root, 0
        while depth < len(key):
            child = node.children.get(key[depth])
            if child is None:
                break
            shared = _common(child.edge, key, depth)
            depth += shared
            node = child
            if shared < len(child.edge):
                break
        return node, depth

    def _stored_under(self, node: _Node[V]) -> Iterator[Stored[V]]:
        stack = [node]
        while stack:
            current = stack.pop()
            if current.stored is not None:
                yield current.stored
            stack.extend(current.children.values())

    # -- changes ------------------------------------------------------------------------

    def insert(self, key: Sequence[int], value: V, size: int) -> list[Stored[V]]:
        """Store ``value`` under ``key`` as the most recently used entry, and return what
        left the tree for it: a key it replaces, keys that are prefixes of it (whatever
        shares a prefix with them shares at least as much with ``key``), and the least
        recently used entries beyond the budget. A value over the whole budget is not
        stored (it is returned)."""
        key = tuple(key)
        entry = Stored(key, value, size, next(self._clock))
        if size > self.budget:
            return [entry]
        node = self._grow(key)
        gone = [s for s in self._ancestors_stored(node)]
        if node.stored is not None:
            gone.append(node.stored)
        for old in gone:
            self.remove(old.key)
        node = self._grow(key)  # removing may have pruned or merged the path
        node.stored = entry
        self._nodes[key] = node
        self.total += size
        while self.total > self.budget:
            # Only entries charged for bytes free any: a zero-size one (a state kept on
            # disk alone) stays findable.
            victim = min((s for s in self.entries() if s.size), key=lambda s: s.used)
            self.remove(victim.key)
            gone.append(victim)
        return gone

    def _ancestors_stored(self, node: _Node[V]) -> Iterator[Stored[V]]:
        current = node.parent
        while current is not None:
            if current.stored is not None:
                yield current.stored
            current = current.parent

    def _grow(self, key: tuple[int, ...]) -> _Node[V]:
        """The node for ``key``, splitting an edge or adding a leaf where needed."""
        node, depth = self._root, 0
        while depth < len(key):
            child = node.children.get(key[depth])
            if child is None:
                leaf = _Node(edge=key[depth:], parent=node)
                node.children[key[depth]] = leaf
                return leaf
            shared = _common(child.edge, key, depth)
            if shared < len(child.edge):
                child = self._split(child, shared)
            node, depth = child, depth + shared
        return node

    @staticmethod
    def _split(node: _Node[V], at: int) -> _Node[V]:
        """Cut ``node``'s edge after ``at`` tokens; the new middle node is returned."""
        parent = node.parent
        assert parent is not None
        middle = _Node(edge=node.edge[:at], parent=parent)
        parent.children[middle.edge[0]] = middle
        node.edge = node.edge[at:]
        node.parent = middle
        middle.children[node.edge[0]] = node
        return middle

    def remove(self, key: Sequence[int]) -> Stored[V] | None:
        """Take ``key``'s entry out (None when it is not stored), pruning empty branches."""
        node = self._nodes.pop(tuple(key), None)
        if node is None or node.stored is None:
            return None
        stored, node.stored = node.stored, None
        self.total -= stored.size
        self._prune(node)
        return stored

    def _prune(self, node: _Node[V]) -> None:
        """Drop nodes left with nothing below them, and merge a node that only passes
        through into its one child (so edges stay long runs)."""
        while node.parent is not None and node.stored is None and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
        if node.parent is not None and node.stored is None and len(node.children) == 1:
            (child,) = node.children.values()
            child.edge = node.edge + child.edge
            child.parent = node.parent
            node.parent.children[child.edge[0]] = child

    def touch(self, key: Sequence[int]) -> None:
        node = self._nodes.get(tuple(key))
        if node is not None and node.stored is not None:
            node.stored.used = next(self._clock)


def _common(edge: tuple[int, ...], key: tuple[int, ...], start: int) -> int:
    """How many of ``edge``'s tokens ``key`` repeats from ``start`` (a run of the same
    tokens compares in one slice)."""
    n = min(len(edge), len(key) - start)
    if edge[:n] == key[start : start + n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if edge[lo:mid] == key[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo
