"""The model picker's listing (``models/choices.py``): the catalog's pairs, the small models
that run alone, the GGUFs on disk the catalog does not name; on-disk ones first, then by
size; what each still costs to download, whether it fits memory, its rate (measured here,
else estimated) and what `models recommend` would pick. Model-free and offline: "cached"
models are small files stamped with the catalog's checksums, and any connection fails."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from edgespec.models import catalog, choices, recommend, speed, store
from edgespec.models.choices import ModelChoice, model_choices
from edgespec.models.measured import record_rate

GIB = recommend.GIB
BIG = recommend.Machine(24 * GIB, ("cpu",), False)
SMALL = recommend.Machine(4 * GIB, ("cpu",), False)  # 3.2 GiB for models: the 1.5B pair only
CALIBRATED = speed.probe_speed(speed.calibration().probe_bytes_per_second)


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    # Other apps' model folders (LM Studio, Ollama, the hub's cache…) are looked for under
    # the home folder and these: an empty home, so only what the test puts there is listed.
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    for name in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_network(*_args, **_kwargs):
        raise AssertionError("model_choices must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(choices, "_probed_speed", lambda: None)  # a machine the probe found no room on
    return tmp_path / "home"


def cache(name: str) -> Path:
    """A stand-in for a verified cached copy: the store trusts an unchanged stamp."""
    model = catalog.lookup(name)
    path = store.models_dir() / f"{name}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + name.encode())
    source = model.registry or model.hub
    store.write_stamp(path, source.sha256, "registry" if model.registry else "hub")
    assert store.cached(model) == path
    return path


def by_key(choices: list[ModelChoice]) -> dict[str, ModelChoice]:
    keys = [c.key for c in choices]
    assert len(keys) == len(set(keys)), keys
    return {c.key: c for c in choices}


def test_every_pair_and_the_small_models_alone(home):
    found = by_key(model_choices(machine=BIG))
    for pair in recommend.pairs():
        choice = found[pair.target.name]
        assert (choice.target, choice.draft) == (pair.target.name, pair.draft.name)
        assert choice.size_bytes == choice.download_bytes == pair.download_bytes
        assert not choice.on_disk and "to download" in choice.label
    for name in ("smollm2-135m", "gemma3-270m"):
        assert found[name].draft is None and found[name].label.startswith(f"{name} alone")
    assert not any(c.key.startswith("file:") for c in found.values())
    assert found["qwen2.5-coder-1.5b"].label.startswith("qwen2.5-coder-1.5b + 0.5b draft · 1.6 GB")
    assert found["llama3.1-8b"].label.startswith("llama3.1-8b + llama3.2-1b draft")


def test_on_disk_first_then_by_size(home):
    cache("qwen2.5-coder-1.5b")
    cache("qwen2.5-coder-0.5b")
    cache("smollm2-135m")
    choices = model_choices(machine=BIG)
    assert [c.key for c in choices[:2]] == ["smollm2-135m", "qwen2.5-coder-1.5b"]
    assert all(c.on_disk for c in choices[:2]) and not any(c.on_disk for c in choices[2:])
    assert choices[1].download_bytes == 0 and "· on disk" in choices[1].label
    rest = [c.size_bytes for c in choices[2:]]
    assert rest == sorted(rest)
    # The 7B shares the cached draft: only its target is left to download.
    seven = by_key(choices)["qwen2.5-coder-7b"]
    assert seven.download_bytes == catalog.lookup("qwen2.5-coder-7b").size
    assert f"{seven.download_bytes / 1e9:.1f} GB to download" in seven.label


def test_what_does_not_fit_says_so(home):
    found = by_key(model_choices(machine=SMALL))
    assert found["qwen2.5-coder-1.5b"].fits and "fit" not in found["qwen2.5-coder-1.5b"].label
    seven = found["qwen2.5-coder-7b"]
    assert not seven.fits and "does not fit memory (needs 6.2 GiB)" in seven.label
    assert [c.fits for c in found.values()].count(True) >= 3  # the 1.5B pair and the two alone


def test_recommended_is_what_models_recommend_picks(home):
    floor = speed.floors().rates[speed.floors().default]
    for machine, found in ((BIG, CALIBRATED), (SMALL, CALIBRATED), (BIG, None)):
        pick = recommend.recommend(machine, found, floor).pair
        recommended = [c for c in model_choices(found, machine) if c.recommended]
        assert [c.key for c in recommended] == [pick.target.name]
        assert recommended[0].label.endswith(" · recommended")
    assert [c.key for c in model_choices(CALIBRATED, BIG) if c.recommended] == ["qwen2.5-coder-1.5b"]


def test_rates_measured_here_beat_estimates(home):
    target = cache("qwen2.5-coder-1.5b")
    cache("qwen2.5-coder-0.5b")
    found = by_key(model_choices(CALIBRATED, BIG))
    estimated = found["qwen2.5-coder-1.5b"]
    assert not estimated.rate_measured and 21 <= estimated.rate <= 39
    assert f"~{speed.format_rate(estimated.rate)} tok/s (estimated)" in estimated.label
    record_rate(target, 31.2, 200)
    measured = by_key(model_choices(CALIBRATED, BIG))["qwen2.5-coder-1.5b"]
    assert measured.rate_measured and measured.rate == pytest.approx(31.2)
    assert measured.label == (
        "qwen2.5-coder-1.5b + 0.5b draft · 1.6 GB · on disk · ~31 tok/s (measured) · recommended"
    )
    # Without a speed nothing is estimated; what was measured still shows.
    bare = by_key(model_choices(None, BIG))
    assert bare["qwen2.5-coder-7b"].rate is None and "tok/s" not in bare["qwen2.5-coder-7b"].label
    assert bare["qwen2.5-coder-1.5b"].rate_measured


def test_without_a_profile_a_cpu_is_probed_as_models_recommend_does(home, monkeypatch):
    """No cost profile measured here (speed None): on a CPU the probe's speed sets the
    estimates and the pick; with GPU offload memory alone decides, as in the command."""
    monkeypatch.setattr(choices, "_probed_speed", lambda: CALIBRATED)
    probed = by_key(model_choices(None, BIG))
    assert probed["qwen2.5-coder-1.5b"].recommended and not probed["qwen2.5-coder-1.5b"].rate_measured
    assert 21 <= probed["qwen2.5-coder-1.5b"].rate <= 39
    gpu = recommend.Machine(24 * GIB, ("cpu", "cuda"), True, 16 * GIB, "GPU")
    on_gpu = by_key(model_choices(None, gpu))
    assert on_gpu["qwen2.5-coder-7b"].rate is None
    assert [k for k, c in on_gpu.items() if c.recommended] == [recommend.recommend(gpu).pair.target.name]


def test_ggufs_on_disk_that_the_catalog_does_not_name(home):
    repo = store.hub_file("someone/Tiny-GGUF", "")
    repo.mkdir(parents=True)
    kept = repo / "tiny-Q4_K_M.gguf"
    for path in (
        kept,
        repo / "mmproj-tiny-f16.gguf",
        repo / "unverified-Q8_0.gguf",
        repo / "t-00002-of-00002.gguf",
    ):
        path.write_bytes(b"GGUF" + b"\0" * 100)
    for path in (kept, repo / "mmproj-tiny-f16.gguf", repo / "t-00002-of-00002.gguf"):
        store.write_stamp(path, "ab" * 32, "hub")  # the second part of a split is listed by its first
    files = [c for c in model_choices(CALIBRATED, BIG) if c.key.startswith("file:")]
    assert [c.key for c in files] == [f"file:{kept}"]
    tiny = files[0]
    assert (tiny.target, tiny.draft, tiny.on_disk, tiny.download_bytes) == (str(kept), None, True, 0)
    assert tiny.label.startswith("someone/Tiny-GGUF/tiny-Q4_K_M alone · 1 MB · on disk")
    assert model_choices(CALIBRATED, BIG)[0] == tiny  # on disk, and the smallest


def test_the_probe_keeps_the_least_disturbed_figure(monkeypatch):
    """A probe taken while something else decodes is slower: the fastest seen is kept, and
    the probe is not taken again within REPROBE_SECONDS."""
    figures = iter([speed.Speed(2e-11, "quiet"), speed.Speed(6e-11, "busy"), speed.Speed(1e-11, "quieter")])
    monkeypatch.setattr(choices, "probe_speed", lambda: next(figures))
    monkeypatch.setattr(choices, "_probes", choices._Probes())
    monkeypatch.setattr(choices, "REPROBE_SECONDS", 0.0)
    assert [choices._probed_speed().source for _ in range(3)] == ["quiet", "quiet", "quieter"]
    monkeypatch.setattr(choices, "REPROBE_SECONDS", 3600.0)
    assert choices._probed_speed().source == "quieter"  # not probed again: the iterator is spent
