"""Sentence embeddings from a GGUF model: the mean of its last hidden states over the
input's tokens, scaled to unit length (as OpenAI's embeddings are).

An ``Embedder`` is a llama.cpp context of its own, made with embeddings on, over a loaded
``Model``'s weights: over the served target it borrows the weights already in memory (on
the GPU where they are), so what it adds is the context (its KV cache and buffers). Over
another GGUF (``Embedder.load``) it loads that model and owns it.

The mean is taken here rather than by llama.cpp's mean pooling: llama.cpp pools within one
batch, which would make the whole input one batch, and a context computing embeddings
also computes logits for every token of a batch (n_vocab floats each: 1.2 GB for 2,048
tokens of a 152 k vocabulary). Per-token states read a small batch at a time
(``EMBED_BATCH``) give the same mean with buffers sized to that batch, and let a long
input go in steps (``begin``, ``advance`` until True, ``result``) that a caller can
interleave with other work on the same thread. A model without causal attention (BERT
and its kind) sees every token at once: its input is one batch.

Nothing here is thread-safe: one input at a time, every call on one thread (the server's
engine thread), and ``close`` before the borrowed model is closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from edgespec.errors import EdgespecError, RequestError
from edgespec.runtime.model import LoadOptions, Model, free_context
from edgespec.runtime.system import default_threads

# Tokens decoded per llama.cpp call for a causal model: the logits of a call's every token
# are computed and kept (see above), 40 MB at this size for a 152 k vocabulary.
EMBED_BATCH = 64
# The most tokens one input may have: OpenAI's embedding models take 8,191.
MAX_CONTEXT = 8192
# The context a model loaded only to embed keeps for generation: none is wanted, and
# llama.cpp refuses very small ones.
_CARRIER_CTX = 64


def causal_attention(metadata: dict[str, object]) -> bool:
    """Whether a GGUF's model attends causally: what its header says, else yes (every
    generative model; encoders such as BERT write ``<arch>.attention.causal = false``)."""
    arch = metadata.get("general.architecture", "")
    return metadata.get(f"{arch}.attention.causal") is not False


class Embedder:
    """Mean-pooled, unit-length embeddings over ``model``'s weights."""

    def __init__(
        self, model: Model, *, n_ctx: int = 0, n_threads: int | None = None, owns_model: bool = False
    ):
        """``n_ctx``: the most tokens one input may have (0: the model's context, at most
        ``MAX_CONTEXT``); ``owns_model``: ``close`` closes the model too."""
        # The loaded llama_model that generation uses: a second context over the same
        # weights is how llama.cpp shares them (read-only) between contexts.
        weights = model._model
        if not weights:
            raise EdgespecError(f"{model.name} is closed: it cannot compute embeddings")
        self.model = model
        self.name = model.name
        self._owns = owns_model
        self.causal = causal_attention(model.gguf.metadata) and not llama_cpp.llama_model_has_encoder(weights)
        size = _context_size(n_ctx or model.n_ctx, model.n_ctx_train)
        self._ctx = llama_cpp.llama_init_from_model(weights, self._params(size, n_threads))
        if not self._ctx:
            raise EdgespecError(f"llama.cpp could not create an embedding context for {model.name}")
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        # What one call decodes: a non-causal model's whole input fits one micro-batch.
        self._chunk = min(llama_cpp.llama_n_batch(self._ctx), llama_cpp.llama_n_ubatch(self._ctx))
        self.max_tokens = min(size, self.n_ctx) if self.causal else min(size, self.n_ctx, self._chunk)
        self.n_embd = llama_cpp.llama_model_n_embd_out(weights)
        self.n_vocab = model.n_vocab
        self._memory = llama_cpp.llama_get_memory(self._ctx)  # None for models without a cache
        self._batch = llama_cpp.llama_batch_init(self._chunk, 0, 1)
        self._tokens: list[int] = []
        self._done = 0
        self._sum = np.zeros(self.n_embd, dtype=np.float64)

    @classmethod
    def load(
        cls, path: Path, *, n_ctx: int = 0, n_threads: int | None = None, n_gpu_layers: int = -1
    ) -> Embedder:
        """An embedder over another GGUF (an embedding model), which it owns."""
        options = LoadOptions(n_ctx=_CARRIER_CTX, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        model = Model(Path(path), options)
        try:
            return cls(model, n_ctx=n_ctx or model.n_ctx_train, n_threads=n_threads, owns_model=True)
        except BaseException:
            model.close()
            raise

    def _params(self, size: int, n_threads: int | None) -> llama_cpp.llama_context_params:
        chunk = EMBED_BATCH if self.causal else size
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = size
        params.n_batch = params.n_ubatch = min(chunk, size)
        params.n_outputs_max = params.n_batch  # every token is an output
        params.n_seq_max = 1
        params.embeddings = True
        # Per-token states: the mean is taken here, across batches (see the module's doc).
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        params.n_threads = params.n_threads_batch = n_threads or default_threads()
        params.no_perf = True
        return params

    # -- inputs ---------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """An input's tokens: its text as the user's (special-token text stays text), with
        the model's own start marker where it adds one."""
        return self.model.tokenize(text, add_special=True, parse_special=False)

    def check(self, tokens: Sequence[int], param: str = "input") -> list[int]:
        """``tokens`` as one input, or a ``RequestError`` naming ``param``."""
        tokens = list(tokens)
        if not tokens:
            raise RequestError("an input to embed has no tokens", param)
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.n_vocab for t in tokens):
            raise RequestError(f"token ids must be integers in [0, {self.n_vocab})", param)
        if len(tokens) > self.max_tokens:
            raise RequestError(
                f"an input is {len(tokens)} tokens but the embedding context holds {self.max_tokens}",
                param,
                "context_length_exceeded",
            )
        return tokens

    # -- one input, in steps ----------------------------------------------------------------

    def begin(self, tokens: Sequence[int]) -> None:
        """Start on one input (checked with ``check``); what the last one left is dropped."""
        if not self._ctx:
            raise EdgespecError(f"the embedding context of {self.name} is closed")
        self._tokens = self.check(tokens)
        self._done = 0
        self._sum[:] = 0.0
        if self._memory:
            llama_cpp.llama_memory_clear(self._memory, True)

    def advance(self) -> bool:
        """Decode the input's next batch; True once all of it is in."""
        if not self._ctx:
            raise EdgespecError(f"the embedding context of {self.name} is closed")
        chunk = self._tokens[self._done : self._done + self._chunk]
        if chunk:
            self._decode(chunk, self._done)
            self._done += len(chunk)
        return self._done >= len(self._tokens)

    def result(self) -> list[float]:
        """The finished input's embedding: the mean state, of unit length (a zero vector
        stays zero)."""
        if not self._tokens or self._done < len(self._tokens):
            raise RuntimeError("result() before the input was fully decoded")
        mean = self._sum / len(self._tokens)
        norm = float(np.linalg.norm(mean))
        return (mean / norm if norm > 0 else mean).astype(np.float32).tolist()

    def _decode(self, chunk: list[int], pos0: int) -> None:
        batch = self._batch
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True  # every token's state is read
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            self._tokens = []
            raise EdgespecError(f"llama.cpp could not compute embeddings (decode status {status})")
        states = llama_cpp.llama_get_embeddings(self._ctx)
        if not states:
            raise EdgespecError("llama.cpp returned no embeddings")
        rows = np.ctypeslib.as_array(states, shape=(len(chunk), self.n_embd))
        self._sum += rows.sum(axis=0, dtype=np.float64)

    # -- whole inputs -----------------------------------------------------------------------

    def embed(self, inputs: Sequence[str | Sequence[int]]) -> list[list[float]]:
        """One embedding per input (text, or token ids), in order."""
        vectors = []
        for item in inputs:
            self.begin(self.tokenize(item) if isinstance(item, str) else item)
            while not self.advance():
                pass
            vectors.append(self.result())
        return vectors

    def close(self) -> None:
        """Free the context (and the model, when owned). Not done on garbage collection: a
        borrowed model may be gone by then, and a leaked context is better than a crash."""
        free_context(self._batch, self._ctx)
        self._batch = self._ctx = None
        if self._owns:
            self.model.close()


def _context_size(wanted: int, trained: int) -> int:
    size = min(wanted, MAX_CONTEXT)
    return max(16, min(size, trained) if trained > 0 else size)
