"""Suffix lookup across conversations: copy what followed the answer's last tokens in an
earlier request the pair has served.

A coding agent re-quotes: the file it read three requests ago, a tool's output, its own
earlier edit. ``ngram`` and ``copy`` look only inside the current context, which a new
conversation (or an agent that trims its history) no longer holds. ``SuffixIndex`` holds
the recent tokens of every answer the loaded pair has seen, prompts and generated tokens
alike; the engine owns one, and every answer's ``SuffixDrafter`` feeds it and looks up in
it.

The store
    One append-only token array (4 bytes a token) in the order tokens were seen, cut into
    *segments*, one writer each. A new prompt shares the longest prefix it has with one of
    the recent conversations (a chat's next request repeats all of the last one, an agent's
    requests share their system prompt): only what it adds is stored, in a segment whose
    *parent* is the token it follows. So the store is a tree of branches, and an answer's
    ``Conversation`` is the ranges of it that spell its context. Answers that take turns
    step by step write a segment a turn; each links to where its writer went on, so a
    continuation reads across them.
The index
    A key is a 64-bit polynomial hash of the ``key`` (4) tokens before a stored token, read
    along its branch; the key maps to its latest such token, and a chain (8 bytes a token)
    links every one to the one before it with the same key. A lookup hashes the context's
    last 4 tokens, walks the newest ``depth`` occurrences and extends each backwards along
    its branch (slice compares, up to ``MAX_MATCH``): the longest match wins, the newest
    among equals. That is what trying keys of 8 down to 4 tokens longest first does, at one
    dictionary entry per distinct 4-gram rather than one per length. A hash collision costs
    one compare: a candidate whose tokens differ matches nothing.
The bound
    At most ``capacity`` tokens (1,000,000 by default): 20 bytes a token in arrays (token,
    chain, key), and a dictionary of at most one entry per token, about 100 bytes each:
    135 MB measured when every 4-gram is new, under 40 MB on text whose 4-grams repeat
    (one in ten new). The oldest tokens go first, so a conversation that is not continued
    ages out, and a key whose latest occurrence goes is deleted with it. Dropped tokens
    are cut from the arrays once they are half of them: eviction costs O(1) amortized per
    token.
What it proposes
    Nothing where the match is as long inside the current context as outside it: ``ngram``
    proposes that already (with the same match length, so the same evidence), and a second
    proposal of the same tokens would count as two lookups agreeing, which the controller
    takes as strong evidence. A proposal is what followed a match *outside* the current
    context (another conversation, or a branch this one left: a regenerated answer) that
    is longer than any inside it, with ``evidence`` its length: the tokens its writer
    wrote after it, never another conversation's.

Feeding is incremental: an answer's committed context only grows, so the drafter hands
the index what the context gained since its last call (checked against the last few
tokens it saw, not the whole context). Tokens an answer commits after its last lookup
reach the index with the next request of the conversation, whose prompt repeats them.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgespec.decoding.drafters.base import AnswerSetup, LookupDrafter
from edgespec.decoding.drafters.ngram import MAX_MATCH

CAPACITY = 1_000_000  # tokens the index holds at most
KEY = 4  # tokens a key covers: the shortest match proposed
DEPTH = 16  # occurrences of a key compared per lookup, newest first
CONVERSATIONS = 64  # recent conversations a new prompt may continue
BULK = 64  # keys of a longer append are hashed with numpy, shorter ones in Python
GUARD = 8  # context tokens compared to tell a grown context from a new one

_MULT = 0x100000001B3  # the hash's multiplier (FNV's prime): odd, so no token is lost
_MASK = (1 << 64) - 1
_NONE = -1  # no earlier token with the same key
_UNKEYED = -2  # fewer than ``key`` tokens before it on its branch


def key_of(tokens: Sequence[int]) -> int:
    """The hash of ``tokens`` (all of them), as ``_hash`` computes it for many at once."""
    h = 0
    for token in tokens:
        h = (h * _MULT + token) & _MASK
    return h


def _hash(window: list[int], k: int, first: int) -> list[int]:
    """The key of the ``k`` tokens before each of ``window[first:]``: in numpy for a long
    run (a prompt), in Python for a step's few tokens, where numpy's calls cost more."""
    n = len(window) - first
    if n < BULK:
        return [key_of(window[t - k : t]) for t in range(first, len(window))]
    tokens, h = np.array(window, dtype=np.uint64), np.zeros(n, dtype=np.uint64)
    for j in range(k):  # uint64 arithmetic wraps, as key_of's mask does
        h = h * np.uint64(_MULT) + tokens[first - k + j : first - k + j + n]
    return h.tolist()


def _common_suffix(a: list[int], b: list[int]) -> int:
    """How many last tokens two equally long lists share: a binary search over slice
    compares (sharing n tokens, they share every fewer)."""
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[-mid:] == b[-mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Conversation:
    """One conversation as the index holds it: the ranges of the store that spell its
    tokens, in order (absolute positions; each range begins after the one before)."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    length: int = 0  # tokens, dropped ones included

    def holds(self, pos: int) -> bool:
        """Is store position ``pos`` part of this conversation?"""
        i = bisect_right(self.starts, pos) - 1
        return i >= 0 and pos < self.ends[i]

    def prefix(self, n: int) -> Conversation:
        """A conversation that shares the first ``n`` tokens of this one."""
        starts, ends, left = [], [], n
        for start, end in zip(self.starts, self.ends, strict=True):
            if left <= 0:
                break
            starts.append(start)
            ends.append(min(end, start + left))
            left -= end - start
        return Conversation(starts, ends, n)


class SuffixIndex:
    """The recent tokens of every conversation a loaded pair has seen, and where each
    4-gram occurred in them (see the module's docstring). Its public calls take a lock:
    the answers of a pair decode one at a time, but a benchmark may feed it from
    another thread."""

    def __init__(self, capacity: int = CAPACITY, key: int = KEY, depth: int = DEPTH):
        assert capacity > key >= 1 and depth >= 1
        self.capacity, self.key, self.depth = capacity, key, depth
        self._lock = threading.Lock()
        self._empty()

    def clear(self) -> None:
        """Forget every conversation: the index a new process starts with."""
        with self._lock:
            self._empty()

    def _empty(self) -> None:
        self._tokens = array("i")
        self._prev = array("q")  # per token: the earlier token with its key, or _NONE, _UNKEYED
        self._keys = array("Q")  # per token: its key (what dropping it deletes)
        self._base = 0  # the absolute position of _tokens[0]
        self._live = 0  # the oldest position still held (those before are dropped)
        self._latest: dict[int, int] = {}  # key -> the latest token with that key
        self._starts: list[int] = []  # where each segment starts (one writer each)
        self._parents: list[int] = []  # ... the token it follows (-1: none)
        self._nexts: list[int] = []  # ... and where its writer went on after it (-1: nowhere yet)
        self._writer: Conversation | None = None  # whose segment the store ends with
        self._recent: list[Conversation] = []  # oldest first

    @property
    def end(self) -> int:
        """The absolute position the next token is stored at."""
        return self._base + len(self._tokens)

    def __len__(self) -> int:
        """Tokens held."""
        return self.end - self._live

    @property
    def keys(self) -> int:
        """Distinct keys indexed (what bounds the dictionary's memory)."""
        return len(self._latest)

    # -- feeding ------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> Conversation:
        """A new answer's conversation: the longest prefix ``prompt`` shares with a recent
        conversation is shared, the rest is stored."""
        with self._lock:
            tokens = np.asarray(prompt, dtype=np.int32)
            best, shared = None, 0
            for conversation in self._recent:
                n = self._shared(conversation, tokens)
                if n > shared:
                    best, shared = conversation, n
            new = best.prefix(shared) if best is not None else Conversation()
            if best is not None and shared == best.length:
                self._recent.remove(best)  # continued: the new one holds all it held
                if self._writer is best:
                    self._writer = new  # ... and writes on in its segment, in one range
            self._recent.append(new)
            del self._recent[:-CONVERSATIONS]
            self._append(new, list(prompt[shared:]))
            return new

    def extend(self, conversation: Conversation, tokens: Sequence[int]) -> None:
        """``conversation`` goes on with ``tokens``."""
        with self._lock:
            self._append(conversation, list(tokens))

    def _shared(self, conversation: Conversation, prompt: np.ndarray) -> int:
        """How many first tokens of ``prompt`` spell the start of ``conversation`` (up to
        the first of its tokens that is no longer held)."""
        n, base = 0, self._base
        for start, end in zip(conversation.starts, conversation.ends, strict=True):
            if start < self._live or n >= len(prompt) or self._tokens[start - base] != prompt[n]:
                return n  # (the first token settles most: no range is copied for it)
            stop = min(end, start + len(prompt) - n)
            stored = np.frombuffer(self._tokens[start - base : stop - base], dtype=np.int32)
            differ = np.flatnonzero(stored != prompt[n : n + len(stored)])
            if differ.size:
                return n + int(differ[0])
            n += len(stored)
            if stop < end:
                return n
        return n

    def _append(self, conversation: Conversation, tokens: list[int]) -> None:
        if not tokens:
            return
        end = self.end
        if self._writer is not conversation or not conversation.ends or conversation.ends[-1] != end:
            # Another conversation wrote last: a new segment, on the token this one
            # follows, so that no continuation runs from one conversation into another.
            parent = conversation.ends[-1] - 1 if conversation.ends else -1
            if parent >= self._live and self._segment_end(parent) == parent + 1:
                # It goes on from its segment's end (answers that take turns): a
                # continuation read there runs on into this segment.
                self._nexts[bisect_right(self._starts, parent) - 1] = end
            self._starts.append(end)
            self._parents.append(parent)
            self._nexts.append(-1)
            conversation.starts.append(end)
            conversation.ends.append(end)
            self._writer = conversation
        before = self._last(conversation)
        self._tokens.extend(tokens)
        self._prev.extend(array("q", [_UNKEYED]) * len(tokens))
        self._keys.extend(array("Q", [0]) * len(tokens))
        self._index(end, [*before, *tokens], len(before))
        conversation.ends[-1] = self.end
        conversation.length += len(tokens)
        self._evict()

    def _last(self, conversation: Conversation) -> list[int]:
        """The conversation's last ``key`` tokens (fewer where it is shorter, or where they
        are no longer held)."""
        k, base, out = self.key, self._base, []
        for start, end in zip(reversed(conversation.starts), reversed(conversation.ends), strict=True):
            lo = max(start, end - (k - len(out)), self._live)
            out[:0] = self._tokens[lo - base : end - base].tolist()
            if len(out) >= k or lo > start:
                break
        return out

    def _index(self, first: int, window: list[int], skip: int) -> None:
        """Key the tokens ``window[skip:]``, stored from position ``first`` on, by the
        ``key`` tokens before each in ``window``."""
        k = self.key
        start = max(skip, k)
        if start >= len(window):
            return
        latest, get = self._latest, self._latest.get
        keys = _hash(window, k, start)
        prev = array("q")
        for pos, key in zip(range(first + start - skip, first + len(window) - skip), keys, strict=True):
            prev.append(get(key, _NONE))
            latest[key] = pos
        lo = first + start - skip - self._base
        self._prev[lo : lo + len(prev)] = prev
        self._keys[lo : lo + len(prev)] = array("Q", keys)

    def _evict(self) -> None:
        """Drop the oldest tokens beyond the capacity, and every key whose latest token
        they held (all its tokens go with it)."""
        over = len(self) - self.capacity
        if over <= 0:
            return
        lo, hi, base, latest = self._live, self._live + over, self._base, self._latest
        for pos, prev, key in zip(
            range(lo, hi), self._prev[lo - base : hi - base], self._keys[lo - base : hi - base], strict=True
        ):
            if prev != _UNKEYED and latest.get(key) == pos:
                del latest[key]
        self._live = hi
        first = bisect_right(self._starts, hi) - 1
        del self._starts[:first], self._parents[:first], self._nexts[:first]
        self._recent = [c for c in self._recent if c.ends and c.ends[-1] > hi]
        if hi - base > len(self._tokens) // 2:  # the dropped are half the arrays: cut them
            del self._tokens[: hi - base], self._prev[: hi - base], self._keys[: hi - base]
            self._base = hi

    # -- looking up ---------------------------------------------------------------------

    def lookup(
        self, conversation: Conversation, context: list[int], max_tokens: int
    ) -> tuple[list[int], int]:
        """(what followed the longest match of ``context``'s end outside ``conversation``,
        its length), where it is longer than any match inside; ([], 0) otherwise."""
        k = self.key
        if max_tokens <= 0 or len(context) < k:
            return [], 0
        with self._lock:
            pos = self._latest.get(key_of(context[-k:]))
            if pos is None:
                return [], 0  # the usual case: one hash and one dictionary probe
            best, longest = self._longest_outside(conversation, context[-MAX_MATCH:], pos)
            if best < 0:
                return [], 0
            return self._follow(best, max_tokens), longest

    def _longest_outside(self, conversation: Conversation, tail: list[int], pos: int) -> tuple[int, int]:
        """Among the newest ``depth`` tokens from ``pos`` back with the tail's key: the one
        after the longest match outside ``conversation`` and the match's length, or
        (-1, 0) where a match inside is as long."""
        # Candidates outside first, then only as much of those inside as can still
        # change the answer: the usual repetition is inside the context alone (ngram's),
        # and on repetitive text every candidate matches long, across segments of a few
        # tokens where answers take turns step by step (a hop of the comparison each).
        outside, inside = [], []
        for _ in range(self.depth):
            if pos < self._live:
                break
            (inside if conversation.holds(pos) else outside).append(pos)
            pos = self._prev[pos - self._base]
        best, longest, limit = -1, 0, len(tail)
        for candidate in outside:
            n = self._match(candidate, tail)
            if n >= self.key and n > longest:  # the newest of equally long ones
                best, longest = candidate, n
                if n >= limit:
                    break
        if best < 0:
            return -1, 0
        last = tail[-longest:]
        if any(self._match(candidate, last) >= longest for candidate in inside):
            return -1, 0  # as long inside: ngram proposes it already
        return best, longest

    def _match(self, pos: int, tail: list[int]) -> int:
        """How many of ``tail``'s last tokens equal those before ``pos`` on its branch: its
        segment back to its start, then on from the token the segment follows."""
        n, limit, end = 0, len(tail), pos
        i = bisect_right(self._starts, pos) - 1
        while n < limit:
            start = max(self._starts[i], self._live)
            take = min(end - start, limit - n)
            stored = self._tokens[end - take - self._base : end - self._base].tolist()
            wanted = tail[limit - n - take : limit - n]
            if stored != wanted:
                return n + _common_suffix(stored, wanted)
            n += take
            parent = self._parents[i]
            if n >= limit or start > self._starts[i] or parent < self._live:
                break  # matched all, or the branch is no longer held before here
            end, i = parent + 1, bisect_right(self._starts, parent) - 1
        return n

    def _follow(self, pos: int, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens from ``pos`` on, as their writer wrote them: to its
        segment's end, and on where the writer went on after it."""
        out: list[int] = []
        while True:
            i = bisect_right(self._starts, pos) - 1
            stop = min(self._segment_end(pos), pos + max_tokens - len(out))
            out += self._tokens[pos - self._base : stop - self._base].tolist()
            pos = self._nexts[i]
            if len(out) >= max_tokens or pos < 0:
                return out

    def _segment_end(self, pos: int) -> int:
        i = bisect_right(self._starts, pos)
        return self._starts[i] if i < len(self._starts) else self.end


class SuffixDrafter(LookupDrafter):
    """The lookup in the pair's ``SuffixIndex``: what followed the answer's last tokens in
    other conversations (and in branches this one left)."""

    name = "suffix"

    def __init__(self, index: SuffixIndex) -> None:
        super().__init__()
        self.index = index
        self._conversation: Conversation | None = None
        self._fed = 0  # context tokens handed to the index
        self._tail: list[int] = []  # the last of them, to tell a grown context from a new one

    def begin(self, setup: AnswerSetup) -> None:
        super().begin(setup)
        self._start(list(setup.prompt))

    def _start(self, context: list[int]) -> None:
        self._conversation = self.index.begin(context)
        self._fed, self._tail = len(context), context[-GUARD:]

    def _feed(self, context: list[int]) -> Conversation:
        """Hand the index what ``context`` gained since the last call: the committed
        context of an answer only grows, so its length and last few tokens tell a grown
        one from a new one (a drafter used again on another text) in O(1)."""
        conversation, fed = self._conversation, self._fed
        if conversation is None or len(context) < fed or context[fed - len(self._tail) : fed] != self._tail:
            self._start(context)
        elif len(context) > fed:
            self.index.extend(conversation, context[fed:])
            self._fed, self._tail = len(context), context[-GUARD:]
        assert self._conversation is not None
        return self._conversation

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        conversation = self._feed(context)
        return self.index.lookup(conversation, context, max_tokens)
