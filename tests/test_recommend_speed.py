"""`models recommend` weighs speed as well as memory: a target's predicted decode rate
(its file's bytes × this machine's seconds per byte) must reach a floor. Model-free and
pure: machines and seconds-per-byte figures are given, nothing is loaded or downloaded."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from edgespec.cli import models as models_cli
from edgespec.cli.main import build_parser
from edgespec.decoding.costs import profile
from edgespec.errors import EdgespecError
from edgespec.models import catalog, recommend, speed

GIB = recommend.GIB
DEFAULT_BYTES = 1_117_320_768  # qwen2.5-coder-1.5b, Q4_K_M
FIXED = speed.pass_overhead_s()  # what a pass costs besides reading the weights
# The 2-core Xeon of the issue: the default target decodes at 11.5 tokens/s.
XEON = speed.Speed((1.0 / 11.5 - FIXED) / DEFAULT_BYTES, "a test figure")
# A 2-core AVX-512 EPYC: 40 ms a token for the default target.
EPYC = speed.Speed((0.040 - FIXED) / DEFAULT_BYTES, "another test figure")
CHAT, QUALITY = speed.floors().rates["chat"], speed.floors().rates["quality"]


def cpu_machine(memory_gib: float = 23.5) -> recommend.Machine:
    return recommend.Machine(int(memory_gib * GIB), ("cpu",), False)


def target(machine: recommend.Machine, found: speed.Speed | None, floor: float) -> str | None:
    pair = recommend.recommend(machine, found, floor).pair
    return pair.target.name if pair else None


def test_a_rate_is_one_over_a_fixed_cost_and_bytes_times_seconds_per_byte():
    model = catalog.lookup("qwen2.5-coder-1.5b")
    assert XEON.rate(model) == pytest.approx(11.5)
    big = catalog.lookup("qwen2.5-coder-7b")
    assert XEON.rate(big) == pytest.approx(1 / (FIXED + big.size * XEON.seconds_per_byte))
    assert speed.Speed(0.0, "nothing").rate(model) is None


def test_memory_alone_decides_without_a_speed():
    assert target(cpu_machine(), None, CHAT) == "qwen3-14b"


def test_the_pair_changes_at_the_floor_exactly():
    """At a floor equal to a target's rate that target (the first of its size) is chosen;
    a hair above it, a smaller one."""
    advice = recommend.recommend(cpu_machine(), XEON, 0.0)
    sizes = sorted({p.target.size for p in advice.fitting}, reverse=True)
    for larger, smaller in itertools.pairwise(sizes):
        first = next(p for p in advice.fitting if p.target.size == larger)
        rate = XEON.rate(first.target)
        assert advice.pick_at(rate) == first
        below = advice.pick_at(math.nextafter(rate, math.inf))
        assert below is not None and below.target.size == smaller


def test_chat_takes_the_default_where_a_14b_would_crawl():
    assert target(cpu_machine(), XEON, CHAT) == "qwen2.5-coder-1.5b"
    assert target(cpu_machine(), EPYC, CHAT) == "qwen2.5-coder-1.5b"
    # Where memory is short, memory still decides first.
    assert target(cpu_machine(2), XEON, CHAT) is None


def test_for_quality_lifts_the_floor():
    assert target(cpu_machine(), XEON, QUALITY) == "qwen3-8b"  # 2.7 tokens/s; the 14Bs 1.5
    assert target(cpu_machine(), EPYC, QUALITY) == "qwen3-14b"  # 3.5 tokens/s
    assert QUALITY < CHAT < speed.floors().rates["speed"]


def test_below_every_floor_the_fastest_pair_that_fits():
    crawl = speed.Speed(1e-8, "a very slow machine")
    advice = recommend.recommend(cpu_machine(), crawl, CHAT)
    assert advice.pair is not None and advice.pair.target.name == "qwen2.5-coder-1.5b"
    assert advice.below_floor


def test_the_trade_names_the_rate_and_the_option():
    xeon = recommend.recommend(cpu_machine(), XEON, CHAT)
    line = recommend.trade(xeon, QUALITY)
    assert line is not None
    assert line.startswith("qwen3-14b fits memory but would answer at about 1.5 tokens/s")
    assert "thinking text" in line
    assert "`--for quality` picks qwen3-8b (about 2.7 tokens/s)" in line
    assert line.endswith("`--min-rate 1.5` picks it")
    assert target(cpu_machine(), XEON, 1.5) == "qwen3-14b"
    epyc = recommend.trade(recommend.recommend(cpu_machine(), EPYC, CHAT), QUALITY)
    assert epyc is not None and epyc.endswith(
        "about 3.5 tokens/s (and its answers open with thinking text); `--for quality` picks it"
    )
    # Nothing traded where the largest that fits is the one chosen.
    assert recommend.trade(recommend.recommend(cpu_machine(), EPYC, QUALITY), QUALITY) is None


def test_the_probe_measures_a_positive_finite_bandwidth():
    bandwidth = speed.probe_bandwidth(nbytes=64 << 20, rounds=2)
    assert bandwidth is not None and math.isfinite(bandwidth) and bandwidth > 0
    found = speed.probe_speed(bandwidth)
    assert found is not None and math.isfinite(found.seconds_per_byte) and found.seconds_per_byte > 0
    assert found.seconds_per_byte == pytest.approx(1 / (bandwidth * speed.calibration().efficiency))
    assert 0.5 < speed.calibration().efficiency < 2


def test_a_profile_measured_here_gives_seconds_per_byte(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # no cached files: the catalog's sizes
    here = {"cpu": "CPU", "isa": "avx2", "cores": "2", "llama.cpp": "build"}
    facts = {**here, "target": "qwen2.5-coder-1.5b cc324af070c2ecbf ngl=-1 threads=all", "draft": "none"}
    data = {"version": profile.PROFILE_VERSION, "facts": facts, "target": {"1": 0.087}, "measured_at": 1.0}
    rank, found = profile.profile_speed(data, here)
    assert found.seconds_per_byte == pytest.approx((0.087 - FIXED) / DEFAULT_BYTES)
    assert found.source == "qwen2.5-coder-1.5b's cost profile (87 ms a token)"
    assert profile.profile_speed(data, {**here, "cpu": "another"}) is None
    assert profile.profile_speed({**data, "provisional": True}, here) is None
    other_build = profile.profile_speed(data, {**here, "llama.cpp": "another"})
    assert other_build is not None and other_build[0] < rank
    # A file the catalog does not know: its size from a size-mtime identity, else unknown.
    unknown = {**facts, "target": "/x/my model.gguf 5000000000-17 ngl=0 threads=2"}
    unknown_speed = profile.profile_speed({**data, "facts": unknown}, here)[1]
    assert unknown_speed.seconds_per_byte == (0.087 - FIXED) / 5e9
    nameless = {**facts, "target": "owner/repo:Q4 0123456789abcdef ngl=0 threads=2"}
    assert profile.profile_speed({**data, "facts": nameless}, here) is None


def test_thinking_models_say_so_in_the_catalog():
    thinking = {m.name for m in catalog.all_models().values() if m.thinking}
    assert {"qwen3-8b", "qwen3-14b", "qwen3-0.6b"} <= thinking
    assert not any(n.startswith(("qwen2.5", "llama", "gemma")) for n in thinking)


# -- the command, in process, with the machine and its speed given --------------------------


def run_recommend(monkeypatch, capsys, found: speed.Speed | None, *options: str, machine=None) -> str:
    monkeypatch.setattr(models_cli, "_machine", lambda: machine or cpu_machine())
    if found is not None:
        monkeypatch.setattr(models_cli, "_measured_speed", lambda _m: (found, ""))
    args = build_parser().parse_args(["models", "recommend", *options])
    assert args.handler(args) == 0
    return capsys.readouterr().out


def test_the_command_names_the_rate_and_the_trade(monkeypatch, capsys):
    out = run_recommend(monkeypatch, capsys, XEON)
    assert "recommended: qwen2.5-coder-1.5b + draft qwen2.5-coder-0.5b" in out
    assert "rate:      about 12 tokens/s before speculation on this machine, from a test figure" in out
    assert "floor:     8 tokens/s before speculation (for chat" in out
    assert "trade:     qwen3-14b fits memory but would answer at about 1.5 tokens/s" in out
    assert "qwen3-14b (1.5 tokens/s)" in out  # among those that also fit


def test_the_command_for_quality_picks_a_larger_thinking_pair(monkeypatch, capsys):
    out = run_recommend(monkeypatch, capsys, XEON, "--for", "quality")
    assert "recommended: qwen3-8b + draft qwen3-0.6b" in out
    assert "floor:     2 tokens/s before speculation (for quality" in out
    assert "its answers open with thinking text" in out
    out = run_recommend(monkeypatch, capsys, XEON, "--min-rate", "1.5")
    assert "recommended: qwen3-14b" in out and "trade:" not in out


def test_the_command_json_carries_the_rates(monkeypatch, capsys):
    answer = json.loads(run_recommend(monkeypatch, capsys, XEON, "--json"))
    assert answer["pair"]["target"] == "qwen2.5-coder-1.5b"
    assert answer["pair"]["tokens_per_second"] == pytest.approx(11.5)
    assert answer["speed"] == {"seconds_per_byte": XEON.seconds_per_byte, "source": "a test figure"}
    assert answer["floor_tokens_per_second"] == CHAT and not answer["below_floor"]
    assert answer["trade"].startswith("qwen3-14b fits memory")
    assert all(p["tokens_per_second"] > 0 for p in answer["fitting"])
    assert {p["target"]: p["thinking"] for p in answer["fitting"]}["qwen3-14b"] is True


def test_the_command_on_a_gpu_keeps_the_memory_rule_and_says_so(monkeypatch, capsys):
    gpu = recommend.Machine(int(64 * GIB), ("cpu", "cuda"), True, int(16 * GIB), "GPU")
    out = run_recommend(monkeypatch, capsys, None, machine=gpu)
    assert "memory alone decides" in out and "rate:" not in out
    assert "recommended: qwen3-14b" in out


def test_a_negative_min_rate_is_one_error(monkeypatch):
    monkeypatch.setattr(models_cli, "_machine", cpu_machine)
    monkeypatch.setattr(models_cli, "_measured_speed", lambda _m: (XEON, ""))
    args = build_parser().parse_args(["models", "recommend", "--min-rate", "-1"])
    with pytest.raises(EdgespecError, match="--min-rate"):
        args.handler(args)
