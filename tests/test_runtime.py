"""The llama.cpp runtime layer against the real default models: batched decoding,
rollback by truncation and by snapshot/restore, tokenization, vocabulary facts."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.runtime.compat import check_pair, text_difference
from edgespec.runtime.model import LoadOptions, Model
from edgespec.runtime.system import widest_isa

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


@pytest.fixture(scope="module", params=["target", "draft"])
def model(request, target_path, draft_path):
    path = target_path if request.param == "target" else draft_path
    m = Model(path, LoadOptions(n_ctx=512, max_outputs=17))
    yield m
    m.close()


def greedy_continuation(m: Model, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """n greedy tokens decoded one at a time, with the logits that produced each."""
    m.sequence(0).reset()
    logits = m.sequence(0).decode(prompt, 1)
    tokens, rows = [], []
    for _ in range(n):
        tokens.append(int(np.argmax(logits[0])))
        logits = m.sequence(0).decode([tokens[-1]], 1)
        rows.append(logits[0].copy())
    return tokens, rows


@pytest.mark.parametrize("k", [2, 3])
def test_batched_decode_equals_single_decodes(model, k):
    """Logits for k positions from ONE decode equal those of k single-token decodes.

    Exact here: llama.cpp's CPU kernels give identical results for batches of up to 3
    tokens. Larger batches switch matrix kernels (see the next test)."""
    prompt = model.tokenize(PROMPT)
    tokens, singles = greedy_continuation(model, prompt, k)
    model.sequence(0).keep(len(prompt))
    batched = model.sequence(0).decode(tokens[:k], k)
    for i in range(k):
        np.testing.assert_allclose(batched[i], singles[i], rtol=0, atol=1e-5)


def test_large_batches_differ_only_by_kernel_rounding(model):
    """From 4 tokens on, llama.cpp's repacked CPU matmul kernels round differently than
    the single-token path. Measured: at most ~0.6 in logits (scale ~20), never a change
    of a clear argmax. This bounds it, so that a real bug (a wrong position, a stale
    cache entry) — which moves logits by whole units — still fails."""
    prompt = model.tokenize(PROMPT)
    tokens, singles = greedy_continuation(model, prompt, 9)
    model.sequence(0).keep(len(prompt))
    batched = model.sequence(0).decode(tokens[:9], 9).copy()
    for i in range(9):
        assert np.abs(batched[i] - singles[i]).max() < 1.5
        top2 = np.sort(singles[i])[-2:]
        if top2[1] - top2[0] > 1.5:
            assert np.argmax(batched[i]) == np.argmax(singles[i])


def test_a_decode_that_reads_no_logits_waits_for_the_backend(model, monkeypatch):
    """Reading logits waits for llama.cpp's backend; a decode that reads none must wait
    explicitly. A GPU backend returns with the work queued, and it was then billed to the
    next decode: the cost profile's single-token pass measured 4.7 ms on an H200, where a
    step took 1.8 ms. (A CPU backend is synchronous, so the wait is observed as a call.)"""
    waits = []
    real = llama_cpp.llama_synchronize
    monkeypatch.setattr(llama_cpp, "llama_synchronize", lambda ctx: (waits.append(ctx), real(ctx))[1])
    prompt = model.tokenize(PROMPT)
    model.sequence(0).reset()
    model.sequence(0).decode(prompt[:4], 0)
    assert len(waits) == 1
    model.sequence(0).decode(prompt[4:6], 1)  # reading its logits waits inside llama.cpp
    assert len(waits) == 1


def next_logits_after(m: Model, prefix: list[int], token: int) -> np.ndarray:
    return m.sequence(0).decode([token], 1)[0].copy()


@pytest.mark.parametrize("mode", ["truncate", "snapshot"])
def test_rollback_matches_fresh_prefill(target_path, mode):
    """Decode n tokens plus extra ones, roll back to n: the next position's logits equal
    those of a fresh prefill of the same n tokens (same kernels, so exactly)."""
    m = Model(target_path, LoadOptions(n_ctx=512, max_outputs=9, rollback=mode))
    try:
        assert m.rollback == mode
        prompt = m.tokenize(PROMPT)
        n = len(prompt) - 1
        m.sequence(0).decode(prompt[:n], 1)
        fresh = next_logits_after(m, prompt[:n], prompt[n])

        m.sequence(0).reset()
        m.sequence(0).decode(prompt[:n], 1)
        m.sequence(0).mark()
        m.sequence(0).decode([prompt[n], 11, 22, 33, 44], 5)  # five positions later rejected
        m.sequence(0).decode([55, 66], 2)
        m.sequence(0).keep(n)
        assert m.sequence(0).tokens == prompt[:n]
        assert m.sequence(0).cache_span() == (0, n - 1)
        rolled = next_logits_after(m, prompt[:n], prompt[n])
        np.testing.assert_allclose(rolled, fresh, rtol=0, atol=1e-5)
    finally:
        m.close()


def test_snapshot_restore_explicit(target_path):
    m = Model(target_path, LoadOptions(n_ctx=512, max_outputs=4))
    try:
        prompt = m.tokenize(PROMPT)
        m.sequence(0).decode(prompt[:-1], 1)
        fresh = next_logits_after(m, prompt[:-1], prompt[-1])
        m.sequence(0).keep(len(prompt) - 1)
        snap = m.sequence(0).snapshot()
        m.sequence(0).decode([prompt[-1], 1, 2, 3], 4)
        m.sequence(0).restore(snap)
        assert m.sequence(0).tokens == prompt[:-1] and m.sequence(0).cache_span()[1] == len(prompt) - 2
        np.testing.assert_allclose(next_logits_after(m, prompt[:-1], prompt[-1]), fresh, rtol=0, atol=1e-5)
        # Keeping fewer tokens than the snapshot holds replays from the start, still right.
        m.rollback = "snapshot"
        m.sequence(0).keep(3)
        assert m.sequence(0).tokens == prompt[:3] and m.sequence(0).cache_span() == (0, 2)
    finally:
        m.close()


def test_sync_reuses_the_shared_prefix(model):
    prompt = model.tokenize(PROMPT)
    model.sequence(0).reset()
    model.sequence(0).decode(prompt, 1)
    other = prompt[:10] + model.tokenize(" something else entirely")
    assert model.sequence(0).sync(other) == 10
    assert model.sequence(0).tokens == prompt[:10] and model.sequence(0).cache_span() == (0, 9)
    # The whole prompt cached: one token is always left to decode (its logits are needed).
    model.sequence(0).reset()
    model.sequence(0).decode(prompt, 1)
    assert model.sequence(0).sync(prompt) == len(prompt) - 1


def test_tokenize_detokenize_and_vocabulary(model):
    text = "Hello, wörld! 你好 👋"
    tokens = model.tokenize(text)
    assert model.detokenize(tokens) == text
    assert model.n_vocab == 151936 and model.eos == 151645 and not model.adds_bos
    assert model.is_eog(model.eos) and not model.is_eog(tokens[0])
    assert model.tokenize("<|im_start|>", parse_special=True) == [151644]
    assert model.piece(151644) == b"<|im_start|>"


def test_context_limit_is_an_error_not_a_crash(draft_path):
    # The smaller model: llama.cpp grants at least 256 positions, and they are all read.
    m = Model(draft_path, LoadOptions(n_ctx=32, max_outputs=2))
    try:
        n = m.n_ctx - 2  # llama.cpp may round the context up; use what it granted
        m.sequence(0).decode([100 + i % 1000 for i in range(n)], 1)
        with pytest.raises(EdgespecError, match="context full"):
            m.sequence(0).decode(list(range(200, 210)), 1)
        assert len(m.sequence(0).tokens) == n and m.sequence(0).cache_span() == (0, n - 1)
    finally:
        m.close()


def test_pair_compatibility_on_loaded_vocabularies(target_path, draft_path, smol_path):
    target = Model(target_path, LoadOptions(n_ctx=64, max_outputs=2), name="target")
    draft = Model(draft_path, LoadOptions(n_ctx=64, max_outputs=2), name="draft")
    smol = Model(smol_path, LoadOptions(n_ctx=64, max_outputs=2), name="smol")
    try:
        check_pair(target, draft)
        assert text_difference(target, draft) is None
        with pytest.raises(EdgespecError, match="draft 'smol' cannot speculate for target 'target'"):
            check_pair(target, smol)
        # Same sizes but different texts would be caught by the token sample:
        assert text_difference(smol, smol) is None
    finally:
        for m in (target, draft, smol):
            m.close()


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        ({"avx", "avx2", "fma", "avx512f", "avx512bw", "amx_tile", "amx_int8"}, "AVX-512 + AMX"),
        ({"avx", "avx2", "fma", "avx512f"}, "AVX-512"),
        ({"avx", "avx2", "fma", "f16c"}, "AVX2"),  # an AVX2 EPYC, also named "AMD EPYC" in a VM
        ({"fp", "asimd", "asimddp"}, "NEON"),
        (set(), "scalar"),
    ],
)
def test_figures_name_the_widest_vector_extension(flags, name):
    assert widest_isa(flags) == name


def test_default_context_is_the_trained_one_bounded_by_memory():
    from edgespec.runtime.context_size import default_context

    per_token = 28 * 2 * 256 * 2  # the default target: 28 layers, 2 KV heads of 128, f16
    assert default_context(32768, per_token, memory=24 << 30) == 32768
    assert default_context(32768, per_token, memory=2 << 30) == 9216  # an eighth of 2 GiB
    assert default_context(32768, per_token, memory=256 << 20) == 2048  # never under 2,048
    assert default_context(0, per_token, memory=24 << 30) == 4096  # a model that does not say


def test_a_context_beyond_the_models_training_is_capped_and_said_so(draft_path, capsys):
    from edgespec.api import EdgeSpec, RuntimeOptions

    lm = EdgeSpec(str(draft_path), None, RuntimeOptions(n_ctx=40_000))
    try:
        assert lm.target.n_ctx == lm.target.n_ctx_train == 32_768
    finally:
        lm.close()
    notes = [line for line in capsys.readouterr().err.splitlines() if "trained" in line]
    assert notes == [
        "edgespec: note: a context of 40,000 tokens is more than qwen2.5-coder-0.5b was trained for; "
        "using 32,768"
    ]
