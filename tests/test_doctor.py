"""`edgespec doctor` on this machine, with the real build and the real models: all well,
with a cost profile the machine cannot live up to, then with a corrupted model in the
cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from edgespec.decoding.costs import describe_model, profile_facts_for, profile_path_for
from edgespec.models import catalog, store
from edgespec.runtime import system

SMOL = "smollm2-135m"


def linked_home(home: Path, names: list[str]) -> Path:
    """A cache holding symbolic links to the real cached models and their stamps: nothing
    is copied, and a stamp doctor rewrites replaces the link, never the original. Not hard
    links: making or removing one changes the file's ctime, part of the identity its kept
    facts are keyed by (``models.kept``), under any test reading it in another worker."""
    models = home / "models"
    models.mkdir(parents=True)
    for name in names:
        source = store.model_file(name)
        for path in (source, source.with_name(source.name + ".json")):
            (models / path.name).symlink_to(path)
    return home


@pytest.fixture()
def home(tmp_path, target_path, draft_path) -> Path:
    return linked_home(tmp_path / "home", [catalog.default_name("target"), catalog.default_name("draft")])


@pytest.mark.needs_models
def test_doctor_all_well(home):
    result = run_cli("doctor", env={"EDGESPEC_HOME": str(home), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "FAIL" not in out and out.rstrip().endswith("all checks passed")
    assert "WARN" not in out  # no profile: nothing to compare the decode speed with
    for fragment in ("os:", "cpu:", "isa:", "llama.cpp build:", "compiled in:", "backends:", "amx:"):
        assert fragment in out, fragment
    assert "compiled in:" in out and "REPACK" in out  # this CPU keeps its repacked weights
    for name in (catalog.default_name("target"), catalog.default_name("draft")):
        assert f"model {name}: ok" in out
        assert f"decode {name}:" in out and "tokens/s" in out
    assert "target buffers:  qwen2.5-coder-1.5b: CPU" in out
    # a fresh cache has no cost profile yet, and says when it will be made
    assert "not measured yet — it will be measured on first use" in out
    assert "verify qwen2.5-coder-1.5b" in result.stderr  # progress on stderr, report on stdout


def profile_in(home: Path, monkeypatch) -> Path:
    """Where the default pair's cost profile lives in ``home``, as doctor loads the pair
    (every layer where a GPU may take it, all threads)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    names = catalog.default_name("target"), catalog.default_name("draft")
    about = [describe_model(name, store.model_file(name), -1, None) for name in names]
    return profile_path_for(profile_facts_for(*about), *names)


@pytest.mark.needs_models
def test_doctor_warns_when_decoding_far_below_its_profile(home, monkeypatch):
    # A profile that says one target pass takes 10 µs (100,000 tokens/s: no CPU decodes a
    # 1.5B model that fast, as a busy machine lags its profile) and a draft pass 100 s
    # (a speed any machine beats).
    path = profile_in(home, monkeypatch)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"measured_at": 1.7e9, "target": {"1": 1e-5}, "draft": {"1": 100.0}}))
    result = run_cli("doctor", env={"EDGESPEC_HOME": str(home), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr  # a warning is no failure
    out = result.stdout
    assert f"cost profile:    {path} (measured " in out
    warnings = [ln for ln in out.splitlines() if ln.startswith("WARN")]
    target = catalog.default_name("target")
    assert len(warnings) == 1, out
    assert warnings[0].startswith(f"WARN {target} decodes at ")
    assert "under half the 100000.0 its cost profile measured" in warnings[0]
    assert "looks busy" in warnings[0] and "will be low" in warnings[0]
    assert "FAIL" not in out and out.rstrip().endswith("all checks passed, 1 warning(s) above")


@pytest.mark.needs_models
def test_doctor_names_a_corrupted_model(home, smol_path):
    copy = home / "models" / smol_path.name
    shutil.copyfile(smol_path, copy)
    shutil.copyfile(smol_path.with_name(smol_path.name + ".json"), copy.with_name(copy.name + ".json"))
    with copy.open("r+b") as fh:
        fh.seek(50_000_000)
        fh.write(b"\xff" * 4096)
    result = run_cli("doctor", env={"EDGESPEC_HOME": str(home), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    fails = [ln for ln in result.stdout.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 1, result.stdout
    assert fails[0].startswith(f"FAIL {SMOL}: checksum mismatch")
    assert fails[0].endswith(f"; run: edgespec models pull {SMOL}")
    assert "1 check(s) failed" in result.stdout
    assert "Traceback" not in result.stderr


# --- the facts doctor and the model loader decide with ---------------------------------

SPR_INFO = (
    b"CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    b"AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
    b"REPACK = 1 | "
)
SPR_FLAGS = {"avx2", "avx512f", "amx_tile", "amx_int8", "amx_bf16"}


def test_amx_guard_only_where_the_library_and_the_cpu_both_have_amx():
    info = system.parse_system_info(SPR_INFO)
    assert info["CPU"]["AMX_INT8"] == "1" and info["CPU"]["REPACK"] == "1"
    assert system.needs_amx_guard(info, SPR_FLAGS)
    assert not system.needs_amx_guard(info, {"avx2", "avx512f"})  # the library alone: the kernel never runs
    no_amx = system.parse_system_info(SPR_INFO.replace(b"AMX_INT8 = 1 | ", b""))
    assert not system.needs_amx_guard(no_amx, SPR_FLAGS)  # a no-amx build keeps CPU_REPACK
    # the library loaded in this process, on this CPU
    here = system.system_info()
    assert "AVX2" in system.compiled_features(here)
    assert system.needs_amx_guard(here, system.cpu_flags()) == (
        system.library_has_amx(here) and system.cpu_has_amx(system.cpu_flags())
    )


def test_backend_sections_and_libraries():
    info = system.parse_system_info(b"Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | ")
    assert info == {"Metal": {"EMBED_LIBRARY": "1"}, "CPU": {"NEON": "1", "ARM_FMA": "1"}}
    assert system.backends(info, Path("/nonexistent")) == ["cpu", "metal"]
    here = system.backend_libraries()
    assert "cpu" in here and "base" not in here


def test_buffer_lines_parsed():
    line = "load_tensors:   CPU_REPACK model buffer size =   596.53 MiB"
    assert system.parse_buffer_line(line) == ("CPU_REPACK", 596.53)
    assert system.parse_buffer_line("sched_reserve:        CPU compute buffer size =    37.84 MiB") is None
