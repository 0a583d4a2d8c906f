"""One GGUF model in llama.cpp, through the low-level ``llama-cpp-python`` API.

A ``Model`` owns one llama.cpp context of one or more sequences, each a ``Sequence``
(``runtime.sequence``: the tokens it holds, its decodes and rollback) that
``model.sequence(seq)`` hands out. The model keeps no current sequence: every call that
works on one names it. It can

* make llama.cpp's calls for a sequence: a batch decoded (stopped by the cancel token or
  arrival given with it), part of it removed, its state saved and loaded;
* decode several sequences' short passes in one batch (``decode_passes``);
* tokenize and detokenize, and report vocabulary facts.

The high-level ``llama_cpp.Llama`` is avoided on purpose: with ``logits_all`` it keeps
n_ctx × n_vocab floats and computes logits for every prompt token.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from edgespec import crashguard
from edgespec.errors import EdgespecError
from edgespec.models.gguf import kv_bytes_per_token, read_info
from edgespec.runtime import rpc, system
from edgespec.runtime.context_size import default_context
from edgespec.runtime.sequence import DecodeAborted, DecodeYielded, PromptExchange, Sequence, Snapshot

__all__ = ["DecodeAborted", "DecodeYielded", "LoadOptions", "Model", "Sequence", "Snapshot"]

ROLLBACK_MODES = ("auto", "truncate", "snapshot")
LOAD_MODE_READ = 0  # llama_load_mode NONE: read the file, no mmap
_ABORTABLE_BATCH = 64  # decodes at least this long stop at once when their answer is stopped


# --- llama.cpp logging -----------------------------------------------------------------

_log_state = {"verbose": False, "recent": [], "buffers": []}


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace") if text else ""
    if _log_state["verbose"]:
        print(message, end="", file=__import__("sys").stderr)
    if "model buffer size" in message:
        # Which buffer types hold the weights (CPU, CPU_REPACK, AMX, CUDA0 ...): the load
        # prints far more lines than ``recent`` keeps, so these are kept apart.
        _log_state["buffers"].append(message)
    # Keep the last lines so that a failed load can say why in one line.
    recent = _log_state["recent"]
    if message.strip():
        recent.append(message.strip())
        del recent[:-20]


_backend_lock = threading.Lock()
_backend_ready = False
_amx_guard: bool | None = None


def amx_guard_needed() -> bool:
    """Whether this library compiled in ggml's AMX buffer type and this CPU has AMX (decided
    once per process: neither can change)."""
    global _amx_guard
    if _amx_guard is None:
        _amx_guard = system.needs_amx_guard(system.system_info(), system.cpu_flags())
    return _amx_guard


def init_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process and route its logs through us. The callback
    object lives at module level: if it were collected, llama.cpp would call freed memory."""
    global _backend_ready
    _log_state["verbose"] = verbose
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


# --- options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model.

    n_gpu_layers: layers offloaded to the GPU; -1 means all of them where a GPU backend
        (Metal, CUDA) exists, and is ignored on a CPU-only build.
    n_ctx: context length in tokens (prompt + answer); 0: what the model was trained for,
        bounded by this machine's memory (``default_context``).
    n_threads: CPU threads; None uses every core this process may run on.
    n_batch: largest batch handed to llama.cpp at once (longer prefills are split).
    max_outputs: most logits rows one decode may return; bounds the logits buffer
        (n_vocab floats per row), so it is set to the largest verification batch.
    rollback: "truncate", "snapshot" or "auto" (truncate where the model allows it).
    n_seq: sequences the context holds, each of n_ctx tokens (one per answer decoding at
        once: the server's slots).
    rpc: workers (HOST:PORT) whose devices take part of the layers (``runtime.rpc``);
        tensor_split: the proportions, this machine's first (empty: by free memory).
    """

    n_gpu_layers: int = -1
    n_ctx: int = 0
    n_threads: int | None = None
    n_batch: int = 128
    max_outputs: int = 33
    rollback: str = "auto"
    n_seq: int = 1
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()


class Model:
    """A loaded GGUF model with one context of ``options.n_seq`` sequences; a call that
    works on one names it (``sequence(seq)``, ``decode_passes``)."""

    def __init__(self, path: Path, options: LoadOptions = LoadOptions(), *, name: str = ""):
        if options.rollback not in ROLLBACK_MODES:
            raise EdgespecError(f"rollback must be one of {', '.join(ROLLBACK_MODES)}")
        init_backend(_log_state["verbose"])
        self.path = Path(path)
        self.name = name or self.path.stem
        self.template_override: str | None = None  # a chat template that replaces the GGUF's
        self.gguf = read_info(self.path)  # one clear line for missing / non-GGUF / truncated
        self.options = options
        self._model = None
        self._ctx = None
        self._batch = None
        self.buffers: dict[str, float] = {}  # weight buffer type → MiB, as llama.cpp reported
        self._load()
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_seq = max(1, self.options.n_seq)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx) // self.n_seq  # per sequence
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.recurrent = bool(
            llama_cpp.llama_model_is_recurrent(self._model) or llama_cpp.llama_model_is_hybrid(self._model)
        )
        self.rollback = options.rollback
        if self.rollback == "auto":
            self.rollback = "snapshot" if self.recurrent else "truncate"
        self.max_outputs = options.max_outputs
        self.sequences = [Sequence(self, seq) for seq in range(self.n_seq)]
        # The pair's prompt cache, once one is attached (``PromptCache.attach``).
        self.prompt_cache: PromptExchange | None = None
        self._piece_buf = ctypes.create_string_buffer(256)
        self._pieces: dict[int, bytes] = {}
        # The cancel token and arrival of the decode in flight, as its caller gave them: the
        # abort callback reads these, so no other answer's stop reaches that decode.
        self._in_flight: tuple[threading.Event | None, threading.Event | None] = (None, None)
        self._abort_cb = llama_cpp.ggml_abort_callback(lambda _data: self._should_stop())
        self._abort_armed = False

    # -- loading ------------------------------------------------------------------------

    def _load(self) -> None:
        self._load_weights(self._model_params())
        self._create_context(self._context_params())

    def _model_params(self) -> llama_cpp.llama_model_params:
        """Where the weights go (GPU layers, RPC workers) and how they are read."""
        opts = self.options
        mparams = llama_cpp.llama_model_default_params()
        if opts.n_gpu_layers < 0:
            mparams.n_gpu_layers = -1 if system.gpu_offload_available() else 0
        else:
            mparams.n_gpu_layers = opts.n_gpu_layers
        self.placement: rpc.Placement | None = None  # the layers over this machine and workers
        if opts.rpc:
            here_gpu = mparams.n_gpu_layers != 0 and system.gpu_offload_available()
            self.placement = rpc.place(self.gguf, opts.rpc, opts.tensor_split, use_gpu=here_gpu)
            self.placement.apply(mparams)
        if mparams.n_gpu_layers == 0 or (self.placement is not None and not here_gpu):
            # On the CPU llama.cpp repacks weights into its own layout; with mmap the
            # file's pages would stay resident beside the copy, nearly doubling memory.
            mparams.load_mode = LOAD_MODE_READ
        if amx_guard_needed():
            # ggml's AMX buffer type repacks Q4_K/Q6_K weights in a way that crashes (SIGSEGV)
            # at the first decode (llama.cpp issue 20824). Extra buffer types are all or
            # nothing, so this also drops CPU_REPACK; only where AMX is compiled in and present.
            mparams.use_extra_bufts = False
        return mparams

    def _load_weights(self, mparams: llama_cpp.llama_model_params) -> None:
        """Loads the GGUF's weights, noting which buffer types hold them."""
        _log_state["recent"].clear()
        _log_state["buffers"].clear()
        crashguard.note(f"{self.name}: loading {self.path.name}")
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        for line in _log_state["buffers"]:
            found = system.parse_buffer_line(line)
            if found:
                self.buffers[found[0]] = self.buffers.get(found[0], 0.0) + found[1]
        if not self._model:
            raise EdgespecError(f"llama.cpp could not load {self.path}: {_last_log_error()}")

    def _context_params(self) -> llama_cpp.llama_context_params:
        """The context's size, sequences, batch and threads, for the loaded weights."""
        opts = self.options
        n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)
        # The default is per sequence: n_seq of them share the memory bound.
        n_ctx = opts.n_ctx or default_context(n_ctx_train, kv_bytes_per_token(self.gguf) * max(1, opts.n_seq))
        if n_ctx < 16:
            self.close()
            raise EdgespecError(f"context length must be at least 16 tokens (got {opts.n_ctx})")
        cparams = llama_cpp.llama_context_default_params()
        # Each sequence has a stream of its own (not unified): a step attends to its own
        # conversation's cells only, however long the others are.
        n_seq = max(1, opts.n_seq)
        cparams.n_ctx = (n_ctx if n_ctx_train <= 0 else min(n_ctx, n_ctx_train)) * n_seq
        cparams.n_batch = cparams.n_ubatch = max(opts.n_batch, opts.max_outputs)
        cparams.n_seq_max = n_seq
        # Several sequences' verification passes may share one decode: a batch's worth
        # of logits rows (llama.cpp grows its buffer only as far as a decode asks).
        self._outputs_capacity = cparams.n_batch if n_seq > 1 else opts.max_outputs
        cparams.n_outputs_max = self._outputs_capacity
        cparams.n_outputs_max_per_seq = opts.max_outputs
        threads = opts.n_threads or system.default_threads()
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        return cparams

    def _create_context(self, cparams: llama_cpp.llama_context_params) -> None:
        """The context and its one reusable batch; with RPC workers, their stalls bounded."""
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise EdgespecError(f"llama.cpp could not create a context for {self.path}: {_last_log_error()}")
        # llama.cpp may lower n_batch (it is capped by the requested n_ctx): ask what it kept.
        self._batch_capacity = llama_cpp.llama_n_batch(self._ctx)
        self.prefill_chunk = self._batch_capacity  # what one llama_decode call reads at most
        self._batch = llama_cpp.llama_batch_init(self._batch_capacity, 0, 1)
        if self.placement is not None:
            self.placement.bound_stalls()

    def close(self) -> None:
        free_context(self._batch, self._ctx)
        self._batch = self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        # At interpreter shutdown llama_cpp may already be gone.
        with contextlib.suppress(Exception):
            self.close()

    # -- vocabulary ---------------------------------------------------------------------

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    @property
    def vocab_type(self) -> int:
        return llama_cpp.llama_vocab_type(self.vocab)

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def is_control(self, token: int) -> bool:
        """A control token (<|im_start|>, <|im_end|> …): structure, not text."""
        return bool(llama_cpp.llama_vocab_is_control(self.vocab, token))

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    @property
    def chat_template(self) -> str | None:
        """The chat template in use: one the user gave (``serve --chat-template``), else
        the GGUF's own."""
        return self.template_override or self.metadata("tokenizer.chat_template")

    def metadata(self, key: str) -> str | None:
        value = self.gguf.metadata.get(key)
        return value if isinstance(value, str) else None

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token as text (special tokens rendered); cached, because
        streaming asks for every generated token."""
        cached = self._pieces.get(token)
        if cached is None:
            n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, True)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, big, -n, 0, True)
                cached = big.raw[:n]
            else:
                cached = self._piece_buf.raw[:n]
            self._pieces[token] = cached
        return cached

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # -- llama.cpp's calls, each for the sequence named -----------------------------------

    def sequence(self, seq: int) -> Sequence:
        """Sequence ``seq`` of the context: what an answer leasing it decodes in."""
        if not 0 <= seq < self.n_seq:
            raise ValueError(f"sequence {seq} outside 0..{self.n_seq - 1}")
        return self.sequences[seq]

    def decode_chunk(
        self,
        seq: int,
        pos0: int,
        chunk: list[int],
        first_output: int,
        cancel: threading.Event | None = None,
        arrival: threading.Event | None = None,
    ) -> int:
        """One ``llama_decode`` of ``chunk`` at positions ``pos0``… of sequence ``seq``,
        logits from ``first_output`` on; llama.cpp's status (2: stopped, by ``cancel`` or
        ``arrival`` being set meanwhile)."""
        batch = self._batch
        n = len(chunk)
        batch.n_tokens = n
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = i >= first_output
        self._arm_abort(n >= _ABORTABLE_BATCH)
        if crashguard.is_armed():  # skip even the formatting when nobody would read it
            crashguard.note(f"{self.name}: decoding {n} tokens at position {pos0}")
        self._in_flight = (cancel, arrival)
        try:
            return llama_cpp.llama_decode(self._ctx, batch)
        finally:
            self._in_flight = (None, None)

    def synchronize(self) -> None:
        llama_cpp.llama_synchronize(self._ctx)

    def logits(self, rows: int) -> np.ndarray:
        """The last decode's ``rows`` logits rows, a view into llama.cpp's buffer."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(rows, self.n_vocab))

    def remove(self, seq: int, start: int) -> bool:
        """Drop positions ``start``… of sequence ``seq`` (-1: all of it, which never fails)."""
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, seq, start, -1))

    def save_state(self, seq: int) -> ctypes.Array:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        data = (ctypes.c_uint8 * max(size, 1))()
        if llama_cpp.llama_state_seq_get_data(self._ctx, data, size, seq) != size:
            raise EdgespecError(f"{self.name}: saving the sequence state failed")
        return data

    def set_state(self, seq: int, data: ctypes.Array) -> bool:
        return bool(llama_cpp.llama_state_seq_set_data(self._ctx, data, len(data), seq))

    def span(self, seq: int) -> tuple[int, int]:
        mem = self._memory
        return llama_cpp.llama_memory_seq_pos_min(mem, seq), llama_cpp.llama_memory_seq_pos_max(mem, seq)

    def last_error(self) -> str:
        return _last_log_error()

    def empty_all(self) -> None:
        """Empty every sequence (llama.cpp's whole memory)."""
        llama_cpp.llama_memory_clear(self._memory, True)
        for sequence in self.sequences:
            sequence.forget()

    def decode_passes(self, passes: list[tuple[int, list[int]]], *, last: bool = False) -> list[np.ndarray]:
        """Several sequences' short passes (``(seq, tokens)``, logits for every token: a
        verification; ``last``: for the last token only, a draft model's step) in as few
        ``llama_decode`` calls as the batch holds, in order of sequence; each pass's logits
        are a copy of its own rows, which outlives the next decode (another answer's, before
        this one's reads them)."""
        if len(passes) == 1:
            seq, tokens = passes[0]
            return [self.sequence(seq).decode(tokens, 1 if last else len(tokens)).copy()]
        results: list[np.ndarray] = [np.empty(0)] * len(passes)
        limit = self._batch_capacity if last else min(self._batch_capacity, self._outputs_capacity)
        group: list[int] = []
        for i in sorted(range(len(passes)), key=lambda i: passes[i][0]):
            if group and sum(len(passes[j][1]) for j in [*group, i]) > limit:
                self._decode_group(passes, group, results, last)
                group = []
            group.append(i)
        self._decode_group(passes, group, results, last)
        return results

    def _decode_group(
        self, passes: list[tuple[int, list[int]]], group: list[int], results: list, last: bool
    ) -> None:
        batch, n, most = self._batch, 0, self._batch_capacity if last else self.max_outputs
        for seq, tokens in (passes[i] for i in group):
            held = self.sequence(seq).tokens
            if not 0 < len(tokens) <= most or len(held) + len(tokens) > self.n_ctx:
                raise ValueError(f"a pass of {len(tokens)} tokens does not fit sequence {seq}")
            for i, token in enumerate(tokens):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, len(held) + i, 1
                batch.seq_id[n][0], batch.logits[n] = seq, not last or i == len(tokens) - 1
                n += 1
        batch.n_tokens = n
        self._arm_abort(False)  # short, and shared: no one answer's stop ends it
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            for seq, _ in (passes[i] for i in group):
                self.remove(seq, len(self.sequences[seq].tokens))
            raise EdgespecError(f"llama.cpp decode failed (status {status}): {_last_log_error()}")
        rows = self.logits(len(group) if last else n)
        start = 0
        for i in group:
            seq, tokens = passes[i]
            self.sequences[seq].tokens.extend(tokens)
            width = 1 if last else len(tokens)
            results[i] = rows[start : start + width].copy()
            start += width

    def _arm_abort(self, armed: bool) -> None:
        """llama.cpp polls the abort callback between graph nodes, several hundred times
        per decode, each a Python call from C: worth it for long prefills (so Stop works
        at once), a measurable tax on the short decodes of the generation loop."""
        if armed != self._abort_armed:
            callback = self._abort_cb if armed else llama_cpp.ggml_abort_callback(0)
            llama_cpp.llama_set_abort_callback(self._ctx, callback, ctypes.c_void_p(0))
            self._abort_armed = armed

    def _should_stop(self) -> bool:
        cancel, arrival = self._in_flight
        return (cancel is not None and cancel.is_set()) or (arrival is not None and arrival.is_set())


def free_context(batch, ctx) -> None:
    """Free a llama.cpp batch and context (either may be None: already freed)."""
    if batch is not None:
        llama_cpp.llama_batch_free(batch)
    if ctx:
        llama_cpp.llama_free(ctx)


def _last_log_error() -> str:
    recent = _log_state["recent"]
    for line in reversed(recent):
        if "error" in line.lower() or "failed" in line.lower():
            return line
    return recent[-1] if recent else "no reason given"
