"""The benchmark: its corpus (halves, kinds, sources), the report's arithmetic, the order
runs are made in (through the real runner and the real default pair), the F16 conversion
behind the f16 regime (on the real SmolLM2 model), and bad input on the command line."""

from __future__ import annotations

import functools
import math
import os
import shutil
import statistics
import subprocess
import sys
from collections import Counter

import pytest
from conftest import REPO, run_cli
from test_models_cli import one_error_line

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.bench.corpus import CATEGORIES, CORPUS, EDIT_KINDS, KINDS, select
from edgespec.bench.prompts import PROMPTS, REPRESENTATIVE
from edgespec.bench.regimes import pair_for
from edgespec.bench.runner import (
    ALL_CONFIGS,
    BASELINE,
    Config,
    Report,
    Run,
    geomean,
    run_benchmark,
    with_baselines,
)
from edgespec.cli.bench import bars, near, noise_line
from edgespec.cli.generate import summary_line
from edgespec.decoding.events import Done, Stats
from edgespec.errors import EdgespecError
from edgespec.models.resolve import resolve
from edgespec.models.store import read_stamp
from edgespec.runtime.quantize import derived_path, quantize, source_key
from lab.llamacpp import LLAMACPP, ReferenceRun, load_bars, loop_bars

# -- the corpus ------------------------------------------------------------------------------


def test_corpus_has_two_even_halves_over_every_category():
    counts = Counter((p.category, p.split) for p in CORPUS)
    for category in CATEGORIES:
        assert counts[category, "dev"] + counts[category, "test"] >= 8, category
        assert counts[category, "dev"] == counts[category, "test"], category
    assert {p.split for p in CORPUS} == {"dev", "test"}
    assert {p.category for p in CORPUS} == set(CATEGORIES)


def test_corpus_ids_sources_and_texts_are_sound():
    ids = [p.id for p in CORPUS]
    assert len(ids) == len(set(ids))
    assert all(p.source.strip() and "edgespec" in p.source for p in CORPUS)
    written = [p for p in CORPUS if p.messages is None]  # agent prompts are conversations
    texts = [p.text.strip() for p in written]
    assert len(texts) == len(set(texts))
    # Short enough for a 2-core CPU: 700 tokens is about 2,800 characters of English.
    assert all(40 <= len(p.text) <= 2800 for p in written), [p.id for p in written if len(p.text) > 2800]


def test_code_editing_covers_every_kind_in_both_halves_and_several_languages():
    edits = [p for p in CORPUS if p.category == "code editing"]
    for split in ("dev", "test"):
        assert {p.kind for p in edits if p.split == split} == set(EDIT_KINDS), split
    languages = {p.text.split("```", 1)[1].split("\n", 1)[0] for p in edits}
    assert "python" in languages and len(languages - {"python"}) >= 2, languages
    assert all(not p.kind for p in CORPUS if p.category not in KINDS)


def test_representative_prompts_come_from_the_dev_half():
    assert set(PROMPTS) == {c for c in CATEGORIES if c != "agent"}  # an agent prompt is no text
    by_id = {p.id: p for p in CORPUS}
    for category, pid in REPRESENTATIVE.items():
        assert by_id[pid].split == "dev" and by_id[pid].category == category
        assert PROMPTS[category] == by_id[pid].text


def test_select_by_split_category_and_id():
    test_half = select("test")
    assert test_half and all(p.split == "test" for p in test_half)
    assert len(select("all")) == len(CORPUS)
    rag = select("dev", ["rag"])
    assert rag and all(p.category == "rag" and p.split == "dev" for p in rag)
    picked = select("test", None, ["math-bakery-1", "edit-rename-js-1"])
    assert [p.id for p in picked] == ["math-bakery-1", "edit-rename-js-1"]  # ids pick across splits
    with pytest.raises(EdgespecError, match="unknown prompt id"):
        select("test", None, ["no-such-prompt"])
    with pytest.raises(EdgespecError, match="unknown category"):
        select("test", ["poetry"])


# -- the report's arithmetic, on synthetic runs ------------------------------------------------


def make_run(prompt: str, config: str, repeat: int, decode: float, e2e: float = 10.0, tokens: int = 100,
             category: str = "code editing") -> Run:  # fmt: skip
    return Run(
        prompt=prompt,
        category=category,
        config=config,
        repeat=repeat,
        seed=None,
        tokens=tokens,
        decode_tps=decode,
        e2e_tps=e2e,
        tau=1.0,
        acceptance=0.0,
        target_passes=tokens - 1,
        drafted=0,
        steps={"none": tokens - 1} if config == BASELINE.label else {"ngram": 10, "none": tokens - 11},
        time_s={},
        python_share=0.0,
    )


def synthetic_report() -> Report:
    auto = ALL_CONFIGS["auto"]
    report = Report(configs=[BASELINE, auto])
    # Prompt a: the baseline is faster in repeat 1; ratios are 2.0, 1.0, 1.5 → median 1.5.
    # Prompt b: ratios 0.5 and 0.5 (the baseline runs differ, the ratios do not).
    speeds = {
        ("a", 0): (10.0, 20.0),
        ("a", 1): (20.0, 20.0),
        ("a", 2): (10.0, 15.0),
        ("b", 0): (10.0, 5.0),
        ("b", 1): (8.0, 4.0),
        ("b", 2): (12.0, 6.0),
    }
    for (prompt, repeat), (base, fast) in speeds.items():
        report.runs.append(make_run(prompt, BASELINE.label, repeat, base))
        report.runs.append(make_run(prompt, "auto", repeat, fast, e2e=12.0))
    return report


def test_ratios_pair_runs_of_the_same_prompt_and_repeat():
    report = synthetic_report()
    auto = ALL_CONFIGS["auto"]
    assert report.prompt_ratios("a", auto, "decode_tps") == [2.0, 1.0, 1.5]
    assert report.prompt_ratio("a", auto) == 1.5  # the median over repeats
    assert report.prompt_ratio("b", auto) == 0.5
    cell = report.summary()["code editing"]["auto"]
    assert cell.decode_ratio == pytest.approx(math.sqrt(1.5 * 0.5))
    assert cell.decode_worst == ("b", 0.5)
    # Per repeat: sqrt(2·0.5) = 1, sqrt(1·0.5), sqrt(1.5·0.5); the spread is their range.
    assert cell.decode_spread == pytest.approx((math.sqrt(0.5), 1.0))
    assert cell.e2e_ratio == pytest.approx(1.2)
    assert cell.steps == pytest.approx({"ngram": 60 / 594, "none": 534 / 594})
    baseline = report.summary()["code editing"][BASELINE.label]
    assert baseline.decode_ratio == pytest.approx(1.0)


def test_geomean_skips_missing_values():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([4.0, math.nan]) == pytest.approx(4.0)
    assert math.isnan(geomean([]))


def test_bars_name_the_slow_prompt_and_the_category():
    report = synthetic_report()
    found = bars(report, report.summary())
    failed = [text for ok, text in found if not ok]
    assert any(text.startswith("code editing: auto ×0.87") and "0.97" in text for text in failed)
    assert any(text.startswith("b: auto ×0.50") for text in failed)  # a long answer, far below
    assert not any(text.startswith("a:") for text in failed)
    # In the f16 regime the open-chat and best-fixed bars come in. Only auto and target-only
    # ran here: not drafting is a fixed configuration too, and auto (×0.87) is more than
    # 10 % behind it.
    chat = synthetic_report()
    for run in chat.runs:
        run.category = "open chat"
    chat_bars = bars(chat, chat.summary(), regime="f16")
    assert any(text.startswith("open chat (f16): auto") for _, text in chat_bars)
    best_fixed = [(ok, text) for ok, text in chat_bars if "best fixed" in text]
    assert best_fixed == [
        (False, "open chat: auto ×0.87 within 10 % of the best fixed configuration (target only ×1.00)")
    ]


def test_auto_is_held_to_the_best_llama_cpp_loop_per_prompt_and_per_category():
    """Each prompt against whichever of llama.cpp's loops did best on it; the category
    against the loop with the best geometric mean there (the lab's bars, added to the
    package's)."""
    report = synthetic_report()  # auto: a ×1.5, b ×0.5
    simple, mod = LLAMACPP[0], LLAMACPP[1]
    assert (simple.label, mod.label) == ("llama.cpp ngram-simple", "llama.cpp ngram-mod")
    report.configs += [simple, mod]
    loop_ratios = {
        (simple.label, "a"): 1.2,
        (simple.label, "b"): 0.4,
        (mod.label, "a"): 1.6,
        (mod.label, "b"): 0.45,
    }
    for (label, prompt), ratio in loop_ratios.items():
        for repeat in range(3):
            base = report.run_of(prompt, BASELINE.label, repeat)
            report.runs.append(make_run(prompt, label, repeat, base.decode_tps * ratio))
    more = functools.partial(loop_bars, b=load_bars())
    found = dict((text, ok) for ok, text in bars(report, report.summary(), more_bars=more))
    assert not any("llama.cpp" in text for _, text in bars(report, report.summary()))
    # a: 1.5 / 1.6 (ngram-mod is best there); b: 0.5 / 0.45
    assert found["a: auto ×0.94 of llama.cpp's best loop on it (llama.cpp ngram-mod; bar ≥ 1.00)"] is False
    assert found["b: auto ×1.11 of llama.cpp's best loop on it (llama.cpp ngram-mod; bar ≥ 1.00)"] is True
    # category: auto sqrt(1.5·0.5) against ngram-mod's sqrt(1.6·0.45) (ngram-simple's is lower)
    expected = math.sqrt(1.5 * 0.5) / math.sqrt(1.6 * 0.45)
    line = f"code editing: auto ×{expected:.2f} of llama.cpp's best loop here (llama.cpp ngram-mod; "
    assert found[line + "geometric means; bar ≥ 1.10)"] is False


def test_llama_cpp_speed_counts_the_requested_tokens_only():
    """llama.cpp's tool keeps the whole draft its last step accepted, past the request:
    those tokens were not asked for, so its rate is the request over the time it took."""
    overshot = ReferenceRun(tokens=208, decode_s=4.0, drafted=192, accepted=192, requested=160)
    assert overshot.delivered == 160
    assert overshot.decode_tps == pytest.approx(40.0)
    ended = ReferenceRun(tokens=90, decode_s=3.0, drafted=10, accepted=4, requested=160)  # at EOS
    assert ended.decode_tps == pytest.approx(30.0)
    unlimited = ReferenceRun(tokens=90, decode_s=3.0, drafted=0, accepted=0)
    assert unlimited.decode_tps == pytest.approx(30.0)


def test_answers_without_a_drafting_step_measure_the_run_s_noise():
    """Where auto decoded plainly it did target-only's work: such a prompt below the bar is
    said to be the run's noise, and their spread is printed; a prompt that drafted is not."""
    report = synthetic_report()
    assert noise_line(report) == ""  # every auto run drafted
    for run in report.runs:
        if run.prompt == "b" and run.config == "auto":
            run.steps = {"none": run.tokens - 1}
    assert report.undrafted_ratios(ALL_CONFIGS["auto"]) == {"b": [0.5, 0.5, 0.5]}
    assert noise_line(report).startswith("this run's noise: on 3 answers auto took no drafting step")
    assert "0.50–0.50 (geometric mean 0.500)" in noise_line(report)
    failed = [text for ok, text in bars(report, report.summary()) if not ok]
    assert any(text.startswith("b: auto ×0.50") and text.endswith("this run's noise") for text in failed)
    report.runs[-1].steps = {"ngram": 3, "none": 96}  # one of b's runs drafted: not the same work
    failed = [text for ok, text in bars(report, report.summary()) if not ok]
    assert any(text.startswith("b: auto ×0.50") and not text.endswith("noise") for text in failed)


def test_a_ratio_just_below_its_bar_is_not_printed_as_the_bar():
    assert near(0.9696, 0.97) == "0.969"  # "×0.97 … bar ≥ 0.97 [FAIL]" would read as a mistake
    assert near(0.9704, 0.97) == "0.97"
    assert near(1.2345, 0.97) == "1.23"


def test_baselines_are_added_for_every_temperature():
    labels = [c.label for c in with_baselines([ALL_CONFIGS["auto"], ALL_CONFIGS["auto T=0.7"]])]
    assert labels == ["target only", "auto", "target only T=0.7", "auto T=0.7"]


def test_decode_phase_speed_leaves_out_the_first_token():
    stats = Stats(tokens=11, wall_s=3.0, ttft_s=1.0)
    assert stats.decode_tokens_per_second == pytest.approx(5.0)
    assert stats.tokens_per_second == pytest.approx(11 / 3)
    assert stats.as_dict()["decode_tokens_per_second"] == 5.0
    assert Stats(tokens=1, wall_s=1.0, ttft_s=1.0).decode_tokens_per_second == 0.0
    line = summary_line(Done(text="x", tail="", stats=stats, stop_reason="eos"))
    assert "decode 5.0" in line and "end-to-end 3.7 tok/s" in line


# -- the real runner ------------------------------------------------------------------------------


def test_runner_interleaves_configurations_and_compares_like_with_like(pair):
    prompt = select("all", None, ["math-bakery-1"])
    configs = [BASELINE, ALL_CONFIGS["ngram γ=4"]]
    seen: list[tuple[str, int, str]] = []
    report = run_benchmark(
        pair,
        prompt,
        configs,
        max_tokens=8,
        repeats=2,
        on_run=lambda r: seen.append((r.prompt, r.repeat, r.config)),
    )
    assert seen == [  # interleaved, and the order turns: neither always runs first
        ("math-bakery-1", 0, "target only"),
        ("math-bakery-1", 0, "ngram γ=4"),
        ("math-bakery-1", 1, "ngram γ=4"),
        ("math-bakery-1", 1, "target only"),
    ]
    assert [(r.prompt, r.repeat, r.config) for r in report.runs] == seen
    for run in report.runs:
        assert 2 <= run.tokens <= 8 and run.decode_tps > 0 and run.e2e_tps > 0
        assert sum(run.steps.values()) == run.target_passes  # one Step event per target pass
        assert run.decode_tps > run.e2e_tps  # the prefill is left out of the decode phase
    base = [r for r in report.runs if r.config == "target only"]
    ngram = [r for r in report.runs if r.config == "ngram γ=4"]
    expected = [n.decode_tps / b.decode_tps for b, n in zip(base, ngram, strict=True)]
    assert report.prompt_ratios("math-bakery-1", configs[1], "decode_tps") == pytest.approx(expected)
    cell = report.summary()["math reasoning"]["ngram γ=4"]
    # One prompt: the geometric mean is that prompt's median ratio over the repeats.
    assert cell.decode_ratio == pytest.approx(statistics.median(expected))
    assert report.costs and report.machine


def test_each_run_starts_as_a_new_process_with_no_earlier_answer_to_copy(pair):
    """A repeat asks the prompt the earlier runs answered: left in the pair's `suffix`
    index, their answers would be drafted whole (a replay, not decoding)."""
    suffix = Config("suffix γ=8", "suffix", 8)
    report = run_benchmark(pair, select("all", None, ["math-bakery-1"]), [suffix], max_tokens=24, repeats=2)
    assert [r.tokens for r in report.runs] == [24, 24]
    assert [r.accepted.get("suffix", 0) for r in report.runs] == [0, 0]


# -- the F16 conversion ------------------------------------------------------------------------------


@pytest.mark.needs_models
def test_f16_copy_is_cached_keyed_by_the_source_and_decodes(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    cached = resolve("smollm2-135m", quiet=True).path
    stamp = read_stamp(cached)
    if stamp is not None and stamp.matches(cached):
        assert source_key(cached) == stamp.sha256[:12]  # the verified checksum, not a re-hash
    source = tmp_path / "smol.gguf"
    shutil.copyfile(cached, source)
    first = quantize(source, quiet=True)
    assert first == derived_path(source) and first.is_file()
    assert first.parent == tmp_path / "home" / "models" / "derived"
    assert not [p for p in first.parent.iterdir() if p.name.endswith(".tmp")]
    assert quantize(source, quiet=True) == first  # cached: no second conversion
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the source "changed"
    assert derived_path(source) != first
    lm = EdgeSpec(str(first), None, RuntimeOptions(n_ctx=256), quiet=True)
    try:
        done = lm.generate("The capital of France is", drafter="none", gamma=0, max_tokens=4)
        assert done.stats.tokens >= 1 and done.text
    finally:
        lm.close()


def test_cpu_regime_loads_what_it_was_given():
    pair = pair_for("cpu", "a.gguf", "b.gguf")
    assert (pair.target, pair.draft) == ("a.gguf", "b.gguf")


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--max-tokens", "1"], "--max-tokens of at least 2"),
        (["--repeats", "0"], "--repeats of at least 1"),
        (["--prompts", "no-such-prompt"], "unknown prompt id 'no-such-prompt'"),
        (["--configs", "model γ=99"], "unknown configuration 'model γ=99'"),
        (["--configs", "auto", "llama.cpp ngram-mod"], "unknown configuration 'llama.cpp ngram-mod'"),
        (["--categories", "poetry"], "unknown category 'poetry'"),
        (["--split", "half"], "invalid choice"),
        (
            ["--app", "none"],
            "--app moved out of the package: from a checkout of edgespec, run python -m lab.app_cost",
        ),
        (["--llamacpp"], "run python -m lab.llamacpp bench"),
        (["--llamacpp-build"], "run python -m lab.llamacpp build"),
        (["--parallel", "1"], "--parallel needs at least 2 answers"),
    ],
)
def test_bench_bad_input_is_one_line(args, fragment):
    one_error_line(run_cli("bench", *args, timeout=120), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["bench", "--binary", "/nonexistent/llama-speculative-simple"], "no llama.cpp tool at /nonexistent"),
        (["bench", "--binary", sys.executable, "--sessions"], "are edgespec bench's own"),
        (["bench", "--binary", sys.executable, "--configs", "llama.cpp ngram-mod", "--max-tokens", "1"],
         "--max-tokens of at least 2"),
    ],
)  # fmt: skip
def test_lab_llamacpp_bad_input_is_one_line(args, fragment):
    """The lab's llama.cpp reference, from a checkout, before any model loads."""
    command = [sys.executable, "-m", "lab.llamacpp", *args]
    one_error_line(subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO), fragment)
