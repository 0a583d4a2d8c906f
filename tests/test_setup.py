"""The set-up's build logic: the recipe each CPU gets, the cache key, the flags really
reaching the build and the venv, and the smoke check that catches a build that crashes.

Rebuilding llama-cpp-python takes minutes, so the build mechanism is exercised through the
same bootstrap functions on a tiny real package whose build records its CMAKE_ARGS."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from conftest import REPO

from edgespec import bootstrap
from edgespec.bootstrap import Build

# /proc/cpuinfo flag sets of real CPU families (abridged to what matters to ggml).
SAPPHIRE_RAPIDS = {
    "sse3",
    "ssse3",
    "fma",
    "f16c",
    "avx",
    "avx2",
    "bmi2",
    "avx512f",
    "avx512bw",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_bf16",
    "amx_tile",
    "amx_int8",
}
# Zen 4: the same AVX-512 extensions, without AMX (and without AVX-VNNI's VEX form).
EPYC_AVX512 = SAPPHIRE_RAPIDS - {"ssse3", "avx_vnni", "amx_bf16", "amx_tile", "amx_int8"}
HASWELL = {"sse3", "fma", "f16c", "avx", "avx2", "bmi2"}
SANDY_BRIDGE = {"sse3", "avx"}


def switches(args: list[str] | str) -> dict[str, str]:
    items = args.split() if isinstance(args, str) else args
    return dict(a.removeprefix("-D").split("=", 1) for a in items)


# --- the recipe ------------------------------------------------------------------------


def test_amx_cpu_gets_the_no_amx_recipe_with_its_isa_spelled_out():
    assert bootstrap.default_recipe("x86_64", SAPPHIRE_RAPIDS) == "no-amx"
    flags = switches(bootstrap.recipe_args("no-amx", "x86_64", SAPPHIRE_RAPIDS))
    assert flags["GGML_NATIVE"] == "OFF"
    for switch in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX512",
                   "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"):  # fmt: skip
        assert flags[switch] == "ON", switch
    for switch in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert flags[switch] == "OFF"


def test_cpus_without_amx_stay_native():
    for flags in (EPYC_AVX512, HASWELL, SANDY_BRIDGE, set()):
        assert bootstrap.default_recipe("x86_64", flags) == "native"
        assert bootstrap.recipe_args("native", "x86_64", flags) == ["-DGGML_RPC=ON"]
    # arm64 has no AMX in this sense, whatever its flags
    assert bootstrap.default_recipe("aarch64", {"asimd", "amx_tile"}) == "native"


def test_portable_recipe_uses_only_the_base_extensions_the_cpu_has():
    flags = switches(bootstrap.recipe_args("portable", "x86_64", SAPPHIRE_RAPIDS))
    assert flags["GGML_NATIVE"] == "OFF" and flags["GGML_AVX2"] == "ON"
    assert all(
        flags[s] == "OFF" for s in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX_VNNI", "GGML_AMX_INT8")
    )
    old = switches(bootstrap.recipe_args("portable", "x86_64", SANDY_BRIDGE))
    assert old["GGML_AVX"] == "ON"
    # ggml turns these on by default when NATIVE is off: a CPU without them must say OFF
    assert all(old[s] == "OFF" for s in ("GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"))
    arm = ["-DGGML_NATIVE=OFF", "-DGGML_RPC=ON"]
    assert bootstrap.recipe_args("portable", "aarch64", {"asimd"}) == arm
    assert bootstrap.recipe_args("portable", "arm64", set()) == arm


def test_user_cmake_args_come_last_and_win():
    args = bootstrap.effective_cmake_args(
        "no-amx", "x86_64", SAPPHIRE_RAPIDS, "-DGGML_CUDA=on -DGGML_AVX512=OFF"
    )
    items = args.split()
    assert items[-2:] == ["-DGGML_CUDA=on", "-DGGML_AVX512=OFF"]
    assert items.index("-DGGML_AVX512=ON") < items.index("-DGGML_AVX512=OFF")  # CMake keeps the last
    # native: the RPC backend, then the user's switches (theirs win: -DGGML_RPC=OFF is kept)
    native = bootstrap.effective_cmake_args("native", "x86_64", HASWELL, " -DGGML_CUDA=on -DGGML_RPC=OFF ")
    assert native == "-DGGML_RPC=ON -DGGML_CUDA=on -DGGML_RPC=OFF"


def test_the_key_covers_the_effective_arguments_so_a_wheel_without_rpc_is_rebuilt(monkeypatch):
    """The key of a build is computed from the arguments it really gets: a wheel built
    before the RPC backend was switched on (its key from the user's CMAKE_ARGS alone) is
    not found again, and the user's own switches still change the key."""
    keys = []
    for user_args in ("", "-DGGML_CUDA=on"):
        monkeypatch.setenv("CMAKE_ARGS", user_args)
        monkeypatch.delenv("EDGESPEC_BUILD", raising=False)
        facts = {
            "llama-cpp-python": bootstrap.LLAMA_CPP_VERSION,
            "CMAKE_ARGS": user_args,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "system": platform.system(),
            "machine": platform.machine(),
            "cpu": hashlib.sha256(bootstrap.cpu_flags().encode()).hexdigest()[:16],
        }
        without_rpc = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]
        build = Build.choose("native")
        assert "-DGGML_RPC=ON" in build.cmake_args.split()
        assert build.key == bootstrap.wheel_key("native", build.cmake_args) != without_rpc
        keys.append(build.key)
    assert keys[0] != keys[1]
    monkeypatch.setenv("CMAKE_ARGS", "")
    keys = {Build.choose(r).key for r in bootstrap.RECIPES}
    assert len(keys) == 3, "each recipe is cached under its own key"
    monkeypatch.setenv("EDGESPEC_BUILD", "portable")
    assert Build.choose().recipe == "portable"


# --- the smoke check -------------------------------------------------------------------

NATIVE = Build("native", "", "k")


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_smoke_check_names_the_signal_that_killed_the_child():
    reason, _ = bootstrap.smoke_check(
        child("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), NATIVE, timeout=60
    )
    assert reason == "the smoke check crashed (SIGSEGV)"
    reason, _ = bootstrap.smoke_check(
        child("import os, signal; os.kill(os.getpid(), signal.SIGILL)"), NATIVE, timeout=60
    )
    assert reason and "SIGILL" in reason and "illegal instruction" in reason


def test_smoke_check_reports_a_failing_child_in_one_line():
    code = "import sys; print('edgespec: error: wrong greedy output', file=sys.stderr); sys.exit(1)"
    reason, _ = bootstrap.smoke_check(child(code), NATIVE, timeout=60)
    assert reason == "the smoke check exited with code 1: edgespec: error: wrong greedy output"
    reason, _ = bootstrap.smoke_check(child("print('not json')"), NATIVE, timeout=60)
    assert reason == "the smoke check printed no report"


def fake_report(features: dict[str, str], *, gpu: bool = False, backends: tuple[str, ...] = ("cpu",)) -> str:
    report = {"ok": True, "system_info": {"CPU": features}, "gpu_offload": gpu, "backends": list(backends)}
    return f"import json; print(json.dumps({report!r}))"


def test_smoke_check_confirms_the_flags_took_effect():
    amx = {"AVX512": "1", "AMX_INT8": "1", "REPACK": "1"}
    for recipe in ("no-amx", "portable"):
        reason, _ = bootstrap.smoke_check(child(fake_report(amx)), Build(recipe, "", "k"), timeout=60)
        assert reason and "still has AMX" in reason
    reason, _ = bootstrap.smoke_check(
        child(fake_report({"AVX512": "1"})), Build("portable", "", "k"), timeout=60
    )
    assert reason and "AVX-512" in reason
    cuda = Build("native", "-DGGML_CUDA=on", "k")
    reason, _ = bootstrap.smoke_check(child(fake_report({"AVX2": "1"})), cuda, timeout=60)
    assert reason == "the build was asked for CUDA but has no cuda backend"
    ok = fake_report({"AVX2": "1"}, gpu=True, backends=("cpu", "cuda"))
    assert bootstrap.smoke_check(child(ok), cuda, timeout=60)[0] is None
    assert bootstrap.smoke_command(Path("py"), Path("m.gguf"), cuda)[-2:] == ["--expect-backend", "cuda"]


def test_real_smoke_check_of_the_installed_build(target_path):
    """The check `make setup` runs: a real greedy decode of the default target in a child."""
    cmd = bootstrap.smoke_command(Path(sys.executable), target_path, NATIVE)
    reason, report = bootstrap.smoke_check(cmd, NATIVE, timeout=300)
    assert reason is None
    assert report["text"].startswith(" a + b")
    assert "cpu" in report["backends"] and report["buffers"]
    assert "AMX_INT8" not in report["system_info"]["CPU"]  # this CPU has no AMX: neither has the build


def test_smoke_command_fails_in_one_line_when_a_backend_is_missing(target_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.runtime.smoke",
            "--model",
            str(target_path),
            "--expect-backend",
            "metal",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == "edgespec: error: this build has no GPU offload, but metal was asked for"


# --- flags reach the build and the venv ------------------------------------------------

# An in-tree PEP 517 backend (standard library only: no setuptools download, no network)
# whose build bakes the CMAKE_ARGS it saw into the package, as a CMake build bakes in flags.
BACKEND = """
import base64, hashlib, os, zipfile

NAME, VERSION = "flagprobe", "1.0"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {
        "flagprobe/__init__.py": "",
        "flagprobe/build.py": "CMAKE_ARGS = %r\\n" % os.environ.get("CMAKE_ARGS", ""),
        "flagprobe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: flagprobe\\nVersion: 1.0\\n",
        "flagprobe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: probe\\n"
        "Root-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (name, digest, len(text.encode())))
    record.append("flagprobe-1.0.dist-info/RECORD,,")
    files["flagprobe-1.0.dist-info/RECORD"] = "\\n".join(record) + "\\n"
    wheel = "flagprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel
"""
PYPROJECT = """
[build-system]
requires = []
build-backend = "probe_backend"
backend-path = ["."]

[project]
name = "flagprobe"
version = "1.0"
"""


def make_sdist(where: Path) -> Path:
    root = where / "src" / "flagprobe-1.0"
    root.mkdir(parents=True)
    (root / "probe_backend.py").write_text(BACKEND)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: flagprobe\nVersion: 1.0\n")
    sdist = where / "flagprobe-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return sdist


def test_changed_cmake_args_build_a_new_wheel_and_install_it(tmp_path, monkeypatch):
    started = time.monotonic()
    sdist = make_sdist(tmp_path)
    venv = tmp_path / "venv"
    # Borrows the base interpreter's pip and setuptools: seconds instead of a fresh pip.
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
    )
    python = venv / "bin" / "python"
    pip_cache = tmp_path / "pip-cache"
    pip_cache.mkdir()
    monkeypatch.setenv("PIP_CACHE_DIR", str(pip_cache))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    cache = tmp_path / "wheels"

    def build_and_install(args: str) -> tuple[Build, Path]:
        build = Build("native", args, bootstrap.wheel_key("native", args))
        wheel = bootstrap.ensure_wheel(
            str(sdist),
            build,
            bootstrap.wheel_dir_for(cache, build, "flagprobe", "1.0"),
            python,
            project="flagprobe",
        )
        bootstrap.install_wheel(wheel, build, venv, python)
        return build, wheel

    def installed_args() -> str:
        code = "import flagprobe.build as b; print(b.CMAKE_ARGS)"
        return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    a, wheel_a = build_and_install("-DGGML_AVX512=ON")
    assert installed_args() == "-DGGML_AVX512=ON"
    b, wheel_b = build_and_install("-DGGML_AVX512=OFF -DGGML_CUDA=on")
    assert a.key != b.key and wheel_a.parent != wheel_b.parent
    assert sorted(p.parent.name for p in cache.glob("*/*.whl")) == sorted(
        [f"flagprobe-1.0-{a.key}", f"flagprobe-1.0-{b.key}"]
    )
    assert installed_args() == "-DGGML_AVX512=OFF -DGGML_CUDA=on"
    stamp = json.loads((venv / bootstrap.VENV_BUILD_INFO).read_text())
    assert stamp["key"] == b.key and stamp["cmake_args"] == "-DGGML_AVX512=OFF -DGGML_CUDA=on"
    assert stamp["wheel_sha256"] == bootstrap.sha256_of(wheel_b)
    info = json.loads((wheel_b.parent / bootstrap.BUILD_INFO).read_text())
    assert info["key"] == b.key and info["build_seconds"] >= 0 and info["built_at"]
    assert bootstrap.installed_files_match(wheel_b, bootstrap.site_packages_of(venv))

    # Back to A: the cached wheel is reused (not rebuilt) and reinstalled over B.
    built_a = wheel_a.stat().st_mtime_ns
    _, again = build_and_install("-DGGML_AVX512=ON")
    assert again == wheel_a and again.stat().st_mtime_ns == built_a
    assert installed_args() == "-DGGML_AVX512=ON"
    assert bootstrap.install_wheel(again, a, venv, python) is False  # current: nothing to do
    assert not list(pip_cache.rglob("*.whl")), "pip's wheel cache was consulted"

    # A wheel marked failed is never reused.
    bootstrap.mark_failed(wheel_a.parent, "the smoke check crashed (SIGSEGV)")
    assert bootstrap.cached_wheel(wheel_a.parent) is None
    assert time.monotonic() - started < 60
