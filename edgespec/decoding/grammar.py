"""Constrained decoding on llama.cpp's own grammar engine (GBNF), through llama-cpp-python.

* ``compile_grammar`` checks a GBNF text with llama.cpp's parser and returns a
  ``GrammarSpec``; ``schema_grammar`` and ``json_object_grammar`` write GBNF for a JSON
  schema / any JSON object with llama-cpp-python's converter, in compact form.
* ``GrammarState`` is one position's parser state (a llama.cpp grammar sampler). The engine
  verifies γ+1 positions in one pass and needs the state each position's own prefix reaches,
  so states are cheap to ``clone``: a clone copies llama.cpp's parse stacks, not the grammar
  text. ``allows`` asks about one token, ``mask`` about the whole vocabulary at once.
* ``constrained_argmax`` is greedy decoding under a grammar: the row's argmax is tried
  first and the full-vocabulary mask is paid only when the grammar refuses it.

llama.cpp's rules, which every method here inherits: an end-of-generation token is allowed
only where the grammar can end; a token whose piece is empty is never allowed; a token that
ends inside a UTF-8 character is allowed when some completion of that character could match.
A state and its clones share scratch buffers: use them from one thread at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import json_schema_to_gbnf

from edgespec.errors import EdgespecError
from edgespec.runtime import model as runtime_model

if TYPE_CHECKING:
    from edgespec.runtime.model import Model

# llama_token_data as numpy sees it: the mask hands llama.cpp one such array over the
# whole vocabulary instead of building 152k ctypes structures.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)

# The converter writes ``space ::= " "?`` after every value, key and punctuation mark. An
# optional space lets a model pad or not at each of them, so nothing after a value is
# forced; with no space at all, keys and punctuation are the only continuation.
COMPACT_SPACE = '""'
# The converter's string characters admit raw control characters, which JSON forbids inside
# strings (``json.loads`` refuses them): they are excluded, as llama.cpp's own JSON grammar does.
_CONVERTER_CHAR = '[^"\\\\]'
_JSON_CHAR = '[^"\\\\\\x7F\\x00-\\x1F]'
# How the converter refuses a schema: it asserts what it recognises and indexes freely.
_CONVERTER_FAILURES = (AssertionError, ValueError, LookupError, TypeError, AttributeError, RecursionError)
_SCHEMA = "response_format"  # the request field a schema's errors name
_MESSAGE_LIMIT = 200  # characters of a parser's or converter's reason kept in an error


class GrammarError(EdgespecError):
    """A grammar or response format llama.cpp cannot use; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str = "grammar"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class GrammarSpec:
    """A GBNF grammar that llama.cpp's parser accepted, and the rule generation starts at."""

    text: str
    root: str = "root"


# --- compiling -------------------------------------------------------------------------

_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what C code writes to file descriptor 2 meanwhile: llama.cpp's grammar parser
    prints its reason there with fprintf, not through the log callback. A temporary file,
    not a pipe: the parser echoes the whole grammar, which can exceed a pipe's buffer."""
    out: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        out.append(sink.read().decode("utf-8", errors="replace"))


def _new_sampler(vocab: Any, spec: GrammarSpec, param: str) -> Any:
    """A llama.cpp grammar sampler for ``spec``, or GrammarError with llama.cpp's reason."""
    if not spec.text.strip():
        raise GrammarError("the grammar is empty", param)
    runtime_model.init_backend(runtime_model._log_state["verbose"])
    with _captured_stderr() as printed:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, spec.text.encode(), spec.root.encode())
    if sampler:
        if printed[0]:
            sys.stderr.write(printed[0])  # someone else's output: pass it on
        return sampler
    recent = runtime_model._log_state["recent"]
    reason = _reason(printed[0], recent[-1] if recent else "")
    raise GrammarError(f"llama.cpp rejected the grammar: {reason}", param)


def _reason(printed: str, last_logged: str) -> str:
    """The most specific line llama.cpp gave: the parser's own reason (printed), else what
    the checks after parsing logged last (a missing root rule, left recursion)."""
    marker = "error parsing grammar: "
    for line in printed.splitlines():
        if marker in line:
            return _shorten(line.split(marker, 1)[1])
    return _shorten(last_logged if "grammar" in last_logged else "failed to parse grammar")


def _shorten(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 1] + "…"


def compile_grammar(gbnf: str, root: str = "root", *, model: Model | None = None) -> GrammarSpec:
    """Check ``gbnf`` with llama.cpp's parser (against ``model``'s vocabulary where given,
    which token references such as ``<|im_end|>`` need) and return it as a GrammarSpec.
    Raises GrammarError (param "grammar") carrying llama.cpp's reason."""
    spec = GrammarSpec(gbnf, root)
    llama_cpp.llama_sampler_free(_new_sampler(None if model is None else model.vocab, spec, "grammar"))
    return spec


def schema_grammar(schema: dict, *, compact: bool = True) -> str:
    """GBNF for the JSON values ``schema`` describes, written by llama-cpp-python's converter.

    compact: no whitespace anywhere between tokens (the converter's optional single space is
        replaced by nothing), so keys, colons and commas are forced; False keeps the
        converter's optional space.
    Keywords the converter does not know (minimum, maxLength on arrays …) are not enforced.
    Raises GrammarError (param "response_format") naming what could not be converted."""
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object (got {type(schema).__name__})", _SCHEMA)
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except _CONVERTER_FAILURES as exc:
        reason = _shorten(str(exc) or type(exc).__name__)
        raise GrammarError(f"cannot turn the JSON schema into a grammar: {reason}", _SCHEMA) from None
    lines = []
    for line in gbnf.splitlines():
        name, _, body = line.partition(" ::= ")
        if compact and name == "space":
            body = COMPACT_SPACE
        elif name == "char" and body.startswith(_CONVERTER_CHAR):
            body = _JSON_CHAR + body[len(_CONVERTER_CHAR) :]
        lines.append(f"{name} ::= {body}" if body else line)
    text = "\n".join(lines) + "\n"
    # The converter's output must parse; if it does not, the schema is at fault.
    llama_cpp.llama_sampler_free(_new_sampler(None, GrammarSpec(text), _SCHEMA))
    return text


def json_object_grammar() -> str:
    """GBNF for any JSON object, compact (``response_format: {"type": "json_object"}``)."""
    return schema_grammar({"type": "object"})


# --- state -----------------------------------------------------------------------------


class _Scratch:
    """Buffers a state and all its clones share: the whole-vocabulary candidate array and a
    one-entry one, each already wrapped in the llama_token_data_array llama.cpp reads."""

    def __init__(self, model: Model):
        self.model = model
        self.n_vocab = model.n_vocab
        self.eog = eog_token(model)
        self.table = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
        self.table["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self.all = llama_cpp.llama_token_data_array(
            data=self.table.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=self.n_vocab,
            selected=-1,
            sorted=False,
        )
        self.all_ptr = ctypes.pointer(self.all)
        self.one = llama_cpp.llama_token_data()
        self.one_array = llama_cpp.llama_token_data_array(
            data=ctypes.pointer(self.one), size=1, selected=-1, sorted=False
        )
        self.one_ptr = ctypes.pointer(self.one_array)
        # One token per byte a text can start with (printable ASCII, tab and line breaks,
        # the lead bytes of longer characters): which of them a state allows tells what
        # characters may come next, for the price of one llama.cpp call over ~150 entries.
        byte_tokens = single_byte_tokens(model)
        probed = [b for b in _PROBED_BYTES if b in byte_tokens]
        self.probe_bytes = np.array(probed, dtype=np.uint8)
        self.probe_ids = np.array([byte_tokens[b] for b in probed], dtype=np.int32)
        self.byte_token = byte_tokens
        self.probe = np.zeros(len(probed), dtype=TOKEN_DATA)
        self.probe_array = llama_cpp.llama_token_data_array(
            data=self.probe.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(probed),
            selected=-1,
            sorted=False,
        )
        self.probe_ptr = ctypes.pointer(self.probe_array)


_PROBED_BYTES = (9, 10, 13, *range(0x20, 0x7F), *range(0xC2, 0xF5))
_byte_tokens: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


def single_byte_tokens(model: Model) -> dict[int, int]:
    """byte -> a token whose piece is that one byte (byte-level BPE and byte-fallback
    vocabularies have one for every byte), found once per loaded model."""
    found = _byte_tokens.get(model)
    if found is None:
        found = {}
        buf = ctypes.create_string_buffer(8)
        for token in range(model.n_vocab):
            if llama_cpp.llama_token_to_piece(model.vocab, token, buf, 8, 0, False) == 1:
                found.setdefault(buf.raw[0], token)
        _byte_tokens[model] = found
    return found


def eog_token(model: Model) -> int:
    """One end-of-generation token: llama.cpp allows all of them or none, so one tells."""
    for token in (model.eos, llama_cpp.llama_vocab_eot(model.vocab)):
        if token >= 0 and model.is_eog(token):
            return token
    for token in range(model.n_vocab):
        if model.is_eog(token):
            return token
    raise EdgespecError(f"{model.name} has no end-of-generation token; a grammar cannot tell where it ends")


def incomplete_utf8_tail(data: bytes) -> bytes:
    """The bytes at the end of ``data`` that start a UTF-8 character and do not finish it."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: the lead byte lies further back
            continue
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return data[-back:] if back < needed else b""
    return b""


class GrammarState:
    """Where a grammar stands after the tokens accepted so far (a llama.cpp grammar sampler).

    accept(token) moves on; clone() copies the state for another branch (a verified
    position, a rollback point); close() frees llama.cpp's memory (also on ``with`` exit)."""

    def __init__(self, model: Model, spec: GrammarSpec):
        self._sampler = _new_sampler(model.vocab, spec, "grammar")
        self.spec = spec
        self._scratch = _Scratch(model)
        # The bytes of a character begun and not finished: llama.cpp lets a grammar end
        # there (it allows EOG wherever a parse stack is empty), which would end the text
        # with a broken character, so EOG waits until the character is complete.
        self._tail = b""

    @classmethod
    def _adopt(cls, sampler: Any, spec: GrammarSpec, scratch: _Scratch, tail: bytes) -> GrammarState:
        state = cls.__new__(cls)
        state._sampler, state.spec, state._scratch, state._tail = sampler, spec, scratch, tail
        return state

    def clone(self) -> GrammarState:
        sampler = llama_cpp.llama_sampler_clone(self._live())
        if not sampler:
            raise EdgespecError("llama.cpp could not copy a grammar state")
        return GrammarState._adopt(sampler, self.spec, self._scratch, self._tail)

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (one llama.cpp check of a one-entry array)."""
        token = int(token)  # numpy integers from an argmax too
        if not 0 <= token < self._scratch.n_vocab:
            return False
        if self._tail and self._scratch.model.is_eog(token):
            return False
        one = self._scratch.one
        one.id, one.logit, one.p = token, 0.0, 0.0
        self._scratch.one_array.size = 1
        llama_cpp.llama_sampler_apply(self._live(), self._scratch.one_ptr)
        return one.logit != -np.inf

    def accept(self, token: int) -> None:
        """Advance by ``token``. A token the grammar refuses raises ValueError: llama.cpp
        itself would abort the process (an EOG where the grammar cannot end) or throw
        through C (a token that empties every parse stack)."""
        if not self.allows(token):
            raise ValueError(f"the grammar does not allow token {token} here")
        token = int(token)
        llama_cpp.llama_sampler_accept(self._live(), token)
        model = self._scratch.model
        if not model.is_eog(token):
            self._tail = incomplete_utf8_tail(self._tail + model.piece(token))

    def mask(self, row: np.ndarray) -> np.ndarray:
        """A copy of the logits ``row`` with every token the grammar refuses at -inf."""
        scratch = self._scratch
        if row.shape != (scratch.n_vocab,):
            raise ValueError(f"a logits row has {scratch.n_vocab} entries (got shape {row.shape})")
        scratch.table["logit"] = row
        scratch.all.size = scratch.n_vocab  # samplers may shrink it; the grammar does not
        llama_cpp.llama_sampler_apply(self._live(), scratch.all_ptr)
        masked = scratch.table["logit"].copy()
        if self._tail:
            for token in np.flatnonzero(masked != -np.inf):
                if scratch.model.is_eog(int(token)):
                    masked[token] = -np.inf
        return masked

    def forced(self) -> int | None:
        """The one token the grammar admits next, or None where it admits several (or none)."""
        allowed = np.flatnonzero(self.mask(np.zeros(self._scratch.n_vocab, dtype=np.float32)) != -np.inf)
        return int(allowed[0]) if len(allowed) == 1 else None

    def next_bytes(self) -> bytes:
        """The bytes a next character may start with (among printable ASCII, tab, line
        breaks and the lead bytes of longer characters), in one llama.cpp call."""
        scratch = self._scratch
        scratch.probe["id"] = scratch.probe_ids
        scratch.probe["logit"] = 0.0
        scratch.probe_array.size = len(scratch.probe)
        llama_cpp.llama_sampler_apply(self._live(), scratch.probe_ptr)
        return scratch.probe_bytes[scratch.probe["logit"] != -np.inf].tobytes()

    def advance_forced(self, limit: int) -> tuple[bytes, bool]:
        """Follow the text the grammar admits as its only continuation, up to ``limit``
        bytes: (that text, whether the grammar must end right after it). This state moves
        past the text. Only ASCII is followed (the bytes inside a longer character are not
        probed), so the text is always whole characters."""
        text = bytearray()
        while len(text) < limit:
            allowed = self.next_bytes()
            if not allowed:
                return bytes(text), self.done()
            if len(allowed) > 1 or allowed[0] >= 0x80 or self.done():
                break
            self.accept(self._scratch.byte_token[allowed[0]])
            text += allowed
        return bytes(text), False

    def done(self) -> bool:
        """Whether the grammar can end here (it allows end of generation)."""
        return self.allows(self._scratch.eog)

    def _live(self) -> Any:
        if self._sampler is None:
            raise ValueError("this grammar state is closed")
        return self._sampler

    def close(self) -> None:
        if self._sampler is not None:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None

    def __enter__(self) -> GrammarState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At interpreter shutdown llama_cpp may already be gone.
        with contextlib.suppress(Exception):
            self.close()


def constrained_argmax(state: GrammarState, row: np.ndarray) -> int:
    """The highest-scoring token the grammar allows. The row's own argmax usually is one, and
    checking it costs one token's check; only when it is refused is the whole vocabulary masked."""
    best = int(np.argmax(row))
    if state.allows(best):
        return best
    masked = state.mask(row)
    best = int(np.argmax(masked))
    if masked[best] == -np.inf:
        raise EdgespecError("the grammar allows no token of this model's vocabulary here")
    return best
