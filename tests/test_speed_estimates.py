"""The rate `models recommend` (and the app's model picker) shows must be near the real one.

On the 2-core calibration machine qwen2.5-coder-1.5b decodes at 27-33 tokens/s (T(1) of
33-35 ms) and SmolLM2-135M's T(1) is about 9 ms (8-12 ms on these CPUs). A pass has a fixed
cost besides reading the weights, so the 135M's time per byte, scaled to the 1.5B's bytes,
predicted 9.9 tokens/s. Pure: synthetic profiles on disk, the probe's bandwidth given."""

from __future__ import annotations

import json

import pytest

from edgespec.cli import models as models_cli
from edgespec.decoding.costs import profile
from edgespec.models import catalog, recommend, speed

REAL_RATE = 30.0  # tokens/s of the default target on the calibration machine
SMOL_T1 = 0.0089  # s: the 135M's single-token pass there (98 MB), what predicted 9.9 tokens/s
QWEN_T1 = 0.034  # s: the default target's (1.1 GB)
DRAFT_T1 = 0.018  # s: qwen2.5-coder-0.5b's (491 MB)
CALIBRATED_PROBE = speed.calibration().probe_bytes_per_second

DEFAULT = catalog.lookup("qwen2.5-coder-1.5b")
SMOL = catalog.lookup("smollm2-135m")
DRAFT = catalog.lookup("qwen2.5-coder-0.5b")


def profile_record(here: dict[str, str], model: catalog.CatalogModel, t1: float, when: float) -> dict:
    sha = model.registry.sha256[:16] if model.registry else "0" * 16
    facts = {**here, "target": f"{model.name} {sha} ngl=0 threads=all", "draft": "none"}
    return {"version": profile.PROFILE_VERSION, "facts": facts, "target": {"1": t1}, "measured_at": when}


@pytest.fixture()
def profiles(tmp_path, monkeypatch):
    """Write cost profiles measured "here" (this machine's facts) into an empty home; the
    probe reads the calibration machine's bandwidth."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(speed, "probe_bandwidth", lambda *_a, **_k: CALIBRATED_PROBE)
    here = profile.profile_facts_for("", None)
    folder = profile.profiles_dir()
    folder.mkdir(parents=True)

    def write(model: catalog.CatalogModel, t1: float, when: float = 1.0) -> None:
        (folder / f"{model.name}-{when:.0f}.json").write_text(
            json.dumps(profile_record(here, model, t1, when))
        )

    return write


def chosen_speed() -> speed.Speed:
    found, why_not = models_cli._measured_speed(recommend.Machine(24 << 30, ("cpu",), False))
    assert found is not None, why_not
    return found


def near_real(rate: float | None) -> bool:
    return rate is not None and 0.7 * REAL_RATE <= rate <= 1.3 * REAL_RATE


def test_a_tiny_models_profile_does_not_set_the_default_targets_rate(profiles):
    """Only the 135M was measured here: the probe decides, and the 1.5B's rate is near
    30 tokens/s (the 135M's own figure predicted 9.9)."""
    assert speed.Speed(SMOL_T1 / SMOL.size, "bytes alone").rate(DEFAULT) < 0.4 * REAL_RATE
    profiles(SMOL, SMOL_T1)
    found = chosen_speed()
    assert "memory probe" in found.source
    assert near_real(found.rate(DEFAULT)), found.rate(DEFAULT)


def test_the_largest_model_measured_sets_the_rate(profiles):
    """A newer profile of a smaller model does not displace the default target's own."""
    profiles(DEFAULT, QWEN_T1, when=1.0)
    profiles(DRAFT, DRAFT_T1, when=2.0)
    profiles(SMOL, SMOL_T1, when=3.0)
    found = chosen_speed()
    assert found.source.startswith("qwen2.5-coder-1.5b's cost profile")
    assert found.rate(DEFAULT) == pytest.approx(1 / QWEN_T1)


def test_a_profile_of_a_few_hundred_megabytes_is_used(profiles):
    profiles(SMOL, SMOL_T1, when=2.0)
    profiles(DRAFT, DRAFT_T1, when=1.0)
    found = chosen_speed()
    assert found.source.startswith("qwen2.5-coder-0.5b's cost profile")
    assert near_real(found.rate(DEFAULT)), found.rate(DEFAULT)


def test_from_pass_refuses_a_model_below_the_floor():
    assert speed.from_pass(SMOL_T1, SMOL.size, "135M") is None
    assert speed.from_pass(QWEN_T1, DEFAULT.size, "1.5B") is not None
    assert SMOL.size < speed.min_profile_bytes() < DRAFT.size


def test_a_tiny_model_is_not_predicted_faster_than_a_pass_allows():
    """The probe's time per byte times 98 MB would be 3 ms a token (over 300 tokens/s); a
    pass's fixed cost puts the 135M near its real 8.9-11.8 ms (EPYC, Xeon)."""
    found = speed.probe_speed(CALIBRATED_PROBE)
    assert found is not None
    assert 1 / 0.012 <= found.rate(SMOL) <= 1 / 0.007
    assert near_real(found.rate(DEFAULT))
    fixed = speed.pass_overhead_s()
    assert found.rate(DRAFT) == pytest.approx(1 / (fixed + DRAFT.size * found.seconds_per_byte))


def test_the_command_says_about_thirty(profiles, monkeypatch, capsys):
    profiles(SMOL, SMOL_T1)
    monkeypatch.setattr(models_cli, "_machine", lambda: recommend.Machine(4 << 30, ("cpu",), False))
    from edgespec.cli.main import build_parser

    args = build_parser().parse_args(["models", "recommend", "--json"])
    assert args.handler(args) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["pair"]["target"] == "qwen2.5-coder-1.5b"
    assert near_real(answer["pair"]["tokens_per_second"]), answer["pair"]
