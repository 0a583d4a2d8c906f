"""Edit-aware copying: follow a source the answer is rewriting, across its edits.

An edit answer is its source with small changes: a rename touches every occurrence, a
signature change one line, a bug fix a few tokens. Plain prompt lookup (``ngram``) loses
the copy at every change and needs several tokens to find it again. This drafter keeps an
*alignment*: the position in the source that the next answer token is expected to copy.

* While the answer copies, the alignment advances one token per token.
* When the answer departs from the source (a replaced, inserted or deleted token or
  word), the alignment is kept where it broke off, and every following answer token is
  looked for in a window just ahead of it: the first token that matches resumes the copy
  there, so a replacement, an insertion and a deletion are all recovered one token after
  the change.
* Once the copy has held again for two tokens, what the answer wrote instead of the source
  becomes a substitution rule (source tokens → answer tokens), applied to the proposal
  ahead: a rename seen once is proposed at its later occurrences. A rule the target
  refuses is forgotten.
* With no alignment it anchors on the longest recent repeat of the answer's last few
  tokens, preferring the request's predicted output (OpenAI's Predicted Outputs), which is
  what the client expects the answer to be.

Sources: the predicted output, then the whole context (the prompt, earlier answers of the
conversation, and this answer so far).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.decoding.drafters.base import AnswerSetup, LookupDrafter

_SEP = -1  # between the prediction and the context: never a token, never copied across
_ANCHOR_SIZES = (6, 5, 4, 3, 2)  # suffix lengths tried when anchoring anew, longest first
_CONFIRM = 2  # tokens a resumed copy must hold before its edit becomes a rule
_MAX_EDIT = 8  # longest source or answer span a substitution rule may cover
_MAX_RULES = 16


@dataclass
class _Cursor:
    """Where the copy stands: the next source position, the tail of a substitution still
    being emitted, and the position an insertion rule was already applied at."""

    pos: int
    pending: tuple[int, ...] = ()
    inserted_at: int = -1


@dataclass
class _Detour:
    """Where the answer left the source: source position and answer length at the break,
    and whether a resumed copy is still unconfirmed."""

    source_pos: int
    answer_len: int
    resumed_at: int = -1  # source position the copy resumed at, while not yet confirmed
    resumed_answer_len: int = 0


class CopyDrafter(LookupDrafter):
    name = "copy"

    def __init__(self, window: int = 48) -> None:
        super().__init__()
        self.window = window  # how far past a break the answer may resume the source
        self._reset([])

    def _reset(self, context: list[int]) -> None:
        self._source: list[int] = [*self.prediction, _SEP]
        self._offset = len(self._source)  # source index of context token 0
        self._recent: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence
        self._predicted: dict[tuple[int, ...], int] = {}  # n-gram -> end of its first in the prediction
        for end in range(1, len(self.prediction) + 1):
            for n in _ANCHOR_SIZES:
                if end >= n:
                    self._predicted.setdefault(tuple(self.prediction[end - n : end]), end)
        self._cursor: _Cursor | None = None
        self._detour: _Detour | None = None
        self._run = 0  # answer tokens the current alignment has held for
        self._replace: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._insert: dict[int, tuple[int, ...]] = {}  # after this source token, insert
        self._rule_sites: dict[int, tuple[str, object]] = {}  # source pos -> rule applied there
        self._answer_start = 0
        self._extend(context, align=False)
        self._answer_start = len(context)

    def begin(self, setup: AnswerSetup) -> None:
        super().begin(setup)
        self._seen = list(setup.prompt)
        self._reset(list(setup.prompt))

    # -- following the answer -----------------------------------------------------------

    def _extend(self, tokens: list[int], *, align: bool) -> None:
        source = self._source
        for token in tokens:
            if align:
                self._follow(token)
            # Index the n-grams ending just before the new token: a match must have a
            # continuation, and the answer's own suffix must never match itself.
            end = len(source)
            for n in _ANCHOR_SIZES:
                if end - n >= self._offset:
                    self._recent[tuple(source[end - n : end])] = end
            source.append(token)

    def _answer(self) -> list[int]:
        return self._source[self._offset + self._answer_start :]

    def _follow(self, token: int) -> None:
        """The target committed ``token``: advance, break off, resume or re-anchor."""
        cursor = self._cursor
        if cursor is not None:
            expected = self._next(cursor)
            if expected is not None and expected[0] == token:
                self._cursor = expected[1]
                self._run += 1
                self._maybe_confirm()
                return
            self._forget_rule_at(cursor.pos)
            detour = self._detour
            if detour is None or detour.resumed_at < 0:
                # A new break (a tentative resumption that fails keeps the first break).
                if detour is None:
                    self._detour = _Detour(cursor.pos, len(self._answer()))
            else:
                detour.resumed_at = -1
            self._cursor = None
            self._run = 0
        self._resume(token)

    def _resume(self, token: int) -> None:
        """Look for ``token`` just ahead of where the answer left the source."""
        detour = self._detour
        if detour is not None:
            answer = self._answer()
            written = len(answer) + 1 - detour.answer_len  # answer tokens since the break, this one included
            if written > self.window:
                self._detour = None  # wandered off: anchor anew
            else:
                source = self._source
                lo, hi = detour.source_pos, min(detour.source_pos + self.window + written, len(source))
                previous = answer[-1] if answer else None
                best = -1
                for j in range(lo, hi):
                    if source[j] != token or source[j] == _SEP:
                        continue
                    if previous is not None and j > lo and source[j - 1] == previous:
                        best = j  # two tokens agree: the strongest evidence, take it
                        break
                    if best < 0:
                        best = j
                if best >= 0:
                    detour.resumed_at = best
                    detour.resumed_answer_len = len(answer)
                    self._cursor = _Cursor(best + 1)
                    self._run = 1
                    return
        self._anchor(token)

    def _anchor(self, token: int) -> None:
        """A fresh alignment after the longest recent repeat of the answer's last tokens
        (with ``token``), preferring the prediction."""
        tail = [*self._source[-(_ANCHOR_SIZES[0] - 1) :], token]
        for n in _ANCHOR_SIZES:
            key = tuple(tail[-n:])
            if _SEP in key:
                continue
            end = self._predicted.get(key)
            if end is None:
                end = self._recent.get(key)
            if end is not None:
                # A break stays open: the text an edit writes is often quoted in the
                # request ("rename hits to calls_by_client"), so the anchor lands there;
                # when that copy fails, the source is resumed after all.
                self._cursor = _Cursor(end)
                self._run = n
                return

    def _maybe_confirm(self) -> None:
        """A resumed copy held for long enough: learn what the answer wrote instead."""
        detour = self._detour
        if detour is None or detour.resumed_at < 0 or self._run < _CONFIRM:
            return
        old = tuple(self._source[detour.source_pos : detour.resumed_at])
        new = tuple(self._answer()[detour.answer_len : detour.resumed_answer_len])
        self._detour = None
        if not new or len(old) > _MAX_EDIT or len(new) > _MAX_EDIT or _SEP in old:
            return  # a deletion is not repeated elsewhere; a long rewrite is not an edit rule
        if len(self._replace) + len(self._insert) >= _MAX_RULES:
            return
        if old:
            self._replace[old] = new
        elif detour.source_pos > 0:
            self._insert[self._source[detour.source_pos - 1]] = new

    def _forget_rule_at(self, pos: int) -> None:
        """The answer left the source exactly where a rule applied: the rule was wrong."""
        site = self._rule_sites.pop(pos, None)
        if site is None:
            return
        kind, key = site
        (self._replace if kind == "replace" else self._insert).pop(key, None)  # type: ignore[arg-type]

    # -- proposing ----------------------------------------------------------------------

    def _next(self, cursor: _Cursor) -> tuple[int, _Cursor] | None:
        """The token the copy expects next, with the rules applied, and the cursor after it."""
        if cursor.pending:
            return cursor.pending[0], _Cursor(cursor.pos, cursor.pending[1:], cursor.inserted_at)
        source, pos = self._source, cursor.pos
        if pos >= len(source) or source[pos] == _SEP:
            return None
        if self._insert and cursor.inserted_at != pos and pos > 0:
            new = self._insert.get(source[pos - 1])
            if new is not None:
                self._rule_sites[pos] = ("insert", source[pos - 1])
                return new[0], _Cursor(pos, new[1:], pos)
        if self._replace:
            for old, new in self._replace.items():
                if source[pos : pos + len(old)] == list(old):
                    self._rule_sites[pos] = ("replace", old)
                    return new[0], _Cursor(pos + len(old), new[1:], cursor.inserted_at)
        return source[pos], _Cursor(pos + 1, (), cursor.inserted_at)

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        new = self._advance(context)
        if new is None:
            self._reset(context[:-1])
            self._extend(context[-1:], align=True)
        else:
            self._extend(new, align=True)
        cursor = self._cursor
        self.from_prediction = cursor is not None and cursor.pos < len(self.prediction)
        if cursor is None or max_tokens <= 0:
            return [], 0
        if not (cursor.pending or self._insert or self._replace):
            # No rule to apply (most copies): the proposal is the source itself, read in
            # one slice rather than token by token (this runs at every step).
            tokens = self._source[cursor.pos : cursor.pos + max_tokens]
            if _SEP in tokens:
                tokens = tokens[: tokens.index(_SEP)]
            return tokens, max(self._run, 1) if tokens else 0
        tokens = []
        while len(tokens) < max_tokens:
            step = self._next(cursor)
            if step is None:
                break
            tokens.append(step[0])
            cursor = step[1]
        return tokens, max(self._run, 1) if tokens else 0
