"""Token bytes to streamed text: never a broken UTF-8 character, never a stop string.

Tokens are byte sequences, and a multi-byte character (emoji, CJK) is often split across
tokens, so bytes go through an incremental UTF-8 decoder that releases only complete
characters. Stop strings can span tokens, so text that could still turn out to be the
start of a stop string is held back until it cannot.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stop_strings: Sequence[str] = ()):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stop_strings if s]
        self._held = ""  # decoded, not yet released
        self.text = ""  # everything released so far
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, token: int) -> str:
        """Add a token; return the text that can be released now. After a stop string
        appears, ``stopped`` is True and the text ends just before it."""
        self._held += self._decoder.decode(self._piece(token))
        return self._release()

    def _release(self) -> str:
        if not self._stops:
            out, self._held = self._held, ""
            self.text += out
            return out
        found = [(i, s) for s in self._stops if (i := self._held.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            out = self._held[:cut]
            self._held = ""
            self.stopped = True
        else:
            keep = self._longest_stop_prefix_suffix()
            out = self._held[: len(self._held) - keep]
            self._held = self._held[len(self._held) - keep :]
        self.text += out
        return out

    def _longest_stop_prefix_suffix(self) -> int:
        """Length of the longest end of the held text that begins some stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best

    def finish(self) -> str:
        """Release whatever is held (the answer ended without completing a stop string)."""
        if self.stopped:
            return ""
        # A character cut in half by max_tokens is dropped, not shown as U+FFFD.
        self._decoder.reset()
        out, self._held = self._held, ""
        self.text += out
        return out
