"""``make setup``: everything a fresh machine needs, and seconds on a ready one.

Runs with the system Python and the standard library only (nothing is installed yet):

1. a virtual environment in ``.venv``;
2. ``llama-cpp-python`` built from source once (minutes) and its wheel cached under
   ``$EDGESPEC_HOME/wheels/<key>``, the key covering everything that changes the binary
   (version, effective CMAKE_ARGS, Python, OS, CPU architecture and instruction-set flags).
   The recipe follows the CPU: "native" (-march=native) where that is safe, "no-amx" on
   Intel CPUs with AMX (whose native build crashes, llama.cpp issue 20824), "portable"
   as the fallback or with ``EDGESPEC_BUILD=portable``; the user's CMAKE_ARGS come last;
3. that exact wheel installed into the venv (a stamp names it: a different build is
   force-reinstalled), then the package, skipped when ``pyproject.toml`` and the wheel are
   unchanged since the last install;
4. the default model pair pulled and verified (``edgespec models pull --default``);
5. the smoke check: a real greedy decode in a separate process. A build that crashes or
   answers wrong is marked failed in its cache directory and replaced, once, by a portable
   build.

The test set-up's own steps (a browser, llama.cpp's sources) are not the package's:
``make setup-test`` runs ``lab/setup_tests.py`` after this.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from edgespec import host
from edgespec.host import home

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
LLAMA_CPP_VERSION = "0.3.36"


def say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def venv_python() -> Path:
    return VENV / "bin" / "python"


def run(cmd: list[str], **kwargs) -> None:
    result = subprocess.run(cmd, check=False, **kwargs)
    if result.returncode != 0:
        sys.exit(f"[setup] failed ({result.returncode}): {' '.join(map(str, cmd))}")


def cpu_flags() -> str:
    """The instruction sets the native build may use: a wheel built for AVX-512 must not
    be reused on a CPU without it."""
    return " ".join(sorted(host.cpu_flags())) or platform.processor()


# --- the build recipe ------------------------------------------------------------------

RECIPES = ("native", "no-amx", "portable")
AMX_FLAGS = {"amx_tile", "amx_int8", "amx_bf16"}
# ggml's switches for the x86 extensions it has kernels for, by /proc/cpuinfo name. The
# first five default ON when GGML_NATIVE is OFF, the rest OFF: each is set explicitly.
X86_BASE = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
}
X86_EXTRA = {
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
    "avx_vnni": "GGML_AVX_VNNI",
}
AMX_OFF = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
# Every recipe has llama.cpp's RPC backend: a target split over machines (``--rpc``) and
# ``edgespec worker`` run on the library the package already ships.
RPC_ON = ["-DGGML_RPC=ON"]


def is_x86(machine: str) -> bool:
    return machine.lower() in {"x86_64", "amd64", "i686", "i386"}


def default_recipe(machine: str, flags: set[str]) -> str:
    """A native (-march=native) build on an AMX CPU compiles ggml's AMX buffer type, which
    crashes at the first decode (llama.cpp issue 20824): there the ISA is spelled out."""
    return "no-amx" if is_x86(machine) and flags & AMX_FLAGS else "native"


def recipe_args(recipe: str, machine: str, flags: set[str]) -> list[str]:
    """Our CMake arguments for a recipe (the user's CMAKE_ARGS come after them)."""
    if recipe == "native":
        return list(RPC_ON)
    if not is_x86(machine):
        return ["-DGGML_NATIVE=OFF", *RPC_ON]
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{switch}={'ON' if flag in flags else 'OFF'}" for flag, switch in X86_BASE.items()]
    extra: dict[str, bool] = {}
    for flag, switch in X86_EXTRA.items():
        extra[switch] = extra.get(switch, False) or (recipe == "no-amx" and flag in flags)
    args += [f"-D{switch}={'ON' if on else 'OFF'}" for switch, on in extra.items()]
    return args + AMX_OFF + RPC_ON


def effective_cmake_args(recipe: str, machine: str, flags: set[str], user_args: str) -> str:
    """What the build really gets: our recipe first, then the user's CMAKE_ARGS, so that the
    user's own switches (-DGGML_CUDA=on) are kept and an explicit choice of theirs wins."""
    return " ".join([*recipe_args(recipe, machine, flags), *user_args.split()])


def wheel_key(recipe: str = "native", cmake_args: str | None = None) -> str:
    """Everything that changes the binary. A native build with the user's CMAKE_ARGS keeps
    exactly the facts earlier set-ups used, so wheels already built are found again."""
    user_args = os.environ.get("CMAKE_ARGS", "")
    facts = {
        "llama-cpp-python": LLAMA_CPP_VERSION,
        "CMAKE_ARGS": user_args if cmake_args is None else cmake_args,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu": hashlib.sha256(cpu_flags().encode()).hexdigest()[:16],
    }
    if recipe != "native":
        facts["recipe"] = recipe
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Build:
    """One way of building llama-cpp-python: the recipe, its effective CMake arguments and
    the cache key they give."""

    recipe: str
    cmake_args: str
    key: str

    @classmethod
    def choose(cls, recipe: str | None = None, user_args: str | None = None) -> Build:
        machine = platform.machine()
        flags = set(cpu_flags().split())
        recipe = recipe or os.environ.get("EDGESPEC_BUILD") or default_recipe(machine, flags)
        if recipe not in RECIPES:
            sys.exit(f"[setup] EDGESPEC_BUILD must be one of {', '.join(RECIPES)} (got {recipe!r})")
        user = os.environ.get("CMAKE_ARGS", "") if user_args is None else user_args
        args = effective_cmake_args(recipe, machine, flags, user)
        return cls(recipe, args, wheel_key(recipe, args))


# --- building and installing the wheel -------------------------------------------------

FAILED_MARKER = "FAILED"
BUILD_INFO = "build-info.json"
VENV_BUILD_INFO = "edgespec-llama-build.json"


def wheel_dir_for(
    cache: Path, build: Build, name: str = "llama-cpp-python", version: str = LLAMA_CPP_VERSION
) -> Path:
    return cache / f"{name}-{version}-{build.key}"


def cached_wheel(wheel_dir: Path) -> Path | None:
    """The usable wheel in ``wheel_dir``: none if it is missing or was marked failed."""
    if (wheel_dir / FAILED_MARKER).exists():
        return None
    found = sorted(wheel_dir.glob("*.whl"))
    return found[0] if found else None


def mark_failed(wheel_dir: Path, reason: str) -> None:
    (wheel_dir / FAILED_MARKER).write_text(reason + "\n")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def ensure_wheel(
    spec: str, build: Build, wheel_dir: Path, python: Path, *, project: str = "llama-cpp-python"
) -> Path:
    """The wheel of ``spec`` built with ``build``'s CMake arguments, from the cache or built now.

    pip's own wheel cache is never consulted (``--no-cache-dir``): it is keyed by the sdist,
    not by CMAKE_ARGS, and would hand back a binary built with other flags."""
    found = cached_wheel(wheel_dir)
    if found:
        return found
    say(
        f"building {spec} ({build.recipe} build, CMAKE_ARGS={build.cmake_args!r}; "
        f"once: cached in {wheel_dir})"
    )
    wheel_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = {**os.environ, "CMAKE_ARGS": build.cmake_args}
    with tempfile.TemporaryDirectory(dir=wheel_dir.parent) as tmp:
        run([str(python), "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
             "--no-binary", project, "-w", tmp, spec], env=env)  # fmt: skip
        staged = Path(tmp) / "ready"
        staged.mkdir()
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"[setup] building {spec} gave {len(wheels)} wheels, expected one")
        wheel = staged / wheels[0].name
        wheels[0].rename(wheel)
        info = {
            "recipe": build.recipe,
            "cmake_args": build.cmake_args,
            "key": build.key,
            "wheel": wheel.name,
            "wheel_sha256": sha256_of(wheel),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (staged / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(wheel_dir, ignore_errors=True)
        staged.rename(wheel_dir)  # atomic: a half-built wheel never looks cached
    say(f"built {wheel.name} in {time.monotonic() - started:.0f} s")
    return wheel_dir / wheel.name


def build_info(wheel: Path, build: Build) -> dict:
    """The wheel's build record; wheels built before records existed get one now."""
    path = wheel.parent / BUILD_INFO
    try:
        info = json.loads(path.read_text())
        if info.get("wheel_sha256") == sha256_of(wheel):
            return info
    except (OSError, ValueError):
        pass
    info = {"recipe": build.recipe, "cmake_args": build.cmake_args, "key": build.key, "wheel": wheel.name,
            "wheel_sha256": sha256_of(wheel), "built_at": None, "build_seconds": None}  # fmt: skip
    with contextlib.suppress(OSError):
        path.write_text(json.dumps(info, indent=1) + "\n")
    return info


def installed_files_match(wheel: Path, site_packages: Path) -> bool:
    """Whether the shared libraries installed in ``site_packages`` are byte for byte those in
    ``wheel`` (and the wheel has some): proof the venv runs this build."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            libs = [n for n in zf.namelist() if n.endswith((".so", ".dylib", ".dll")) or ".so." in n]
            if not libs:
                libs = [n for n in zf.namelist() if n.endswith(".py") and ".dist-info/" not in n]
            for name in libs:
                target = site_packages / name
                if not target.is_file() or hashlib.sha256(zf.read(name)).hexdigest() != sha256_of(target):
                    return False
            return bool(libs)
    except (OSError, zipfile.BadZipFile):
        return False


def site_packages_of(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages")) or sorted(venv.glob("Lib/site-packages"))
    return found[0] if found else venv / "lib" / "site-packages"


def install_wheel(wheel: Path, build: Build, venv: Path, python: Path) -> bool:
    """Make ``venv`` run exactly ``wheel``: reinstalled (without dependencies) whenever the
    stamp names another build. Returns True when it installed something."""
    info = build_info(wheel, build)
    stamp = venv / VENV_BUILD_INFO
    try:
        current = json.loads(stamp.read_text())
    except (OSError, ValueError):
        current = {}
    if current.get("wheel_sha256") == info["wheel_sha256"] and current.get("key") == build.key:
        return False
    # A venv set up before stamps existed may already hold this very build: compare the
    # installed libraries with the wheel's before reinstalling.
    if not current and installed_files_match(wheel, site_packages_of(venv)):
        stamp.write_text(json.dumps(info, indent=1) + "\n")
        return False
    say(f"installing {wheel.name} ({build.recipe} build) into {venv.name}")
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir",
         "--force-reinstall", "--no-deps", str(wheel)])  # fmt: skip
    if not installed_files_match(wheel, site_packages_of(venv)):
        sys.exit(f"[setup] {venv.name} does not hold the files of {wheel} after installing it")
    stamp.write_text(json.dumps(info, indent=1) + "\n")
    return True


def ensure_venv() -> None:
    # This runs on the system Python, which may be older than the package requires.
    if sys.version_info < (3, 11):  # noqa: UP036
        sys.exit(f"[setup] edgespec needs Python >= 3.11 (this is {platform.python_version()})")
    if not venv_python().exists():
        say(f"creating virtual environment {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
        run([str(venv_python()), "-m", "pip", "install", "-q", "--upgrade", "pip", "wheel"])


def ensure_installed(wheel_dir: Path) -> None:
    stamp = VENV / ".edgespec-install"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + str(wheel_dir).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return
    say("installing edgespec and its dependencies into .venv")
    run([str(venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--find-links", str(wheel_dir), "--only-binary", "llama-cpp-python",
         "-e", f"{ROOT}[test]"])  # fmt: skip
    stamp.write_text(want)


# --- the smoke check -------------------------------------------------------------------


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (illegal instruction: built for another CPU)" if name == "SIGILL" else ""
        return f"crashed ({name}){hint}"
    return f"exited with code {code}"


def smoke_check(cmd: list[str], build: Build, *, timeout: float = 600) -> tuple[str | None, dict]:
    """Run the smoke check ``cmd`` (a separate process: a bad build kills it, not us).
    Returns (None, its JSON report) when the build is sound, else (one-line reason, {})."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"the smoke check hung for {timeout:.0f} s", {}
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        detail = f": {last[-1].strip()}" if last and proc.returncode > 0 else ""
        return f"the smoke check {describe_exit(proc.returncode)}{detail}", {}
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "the smoke check printed no report", {}
    args = build.cmake_args.upper().replace(" ", "")
    features = {k for fields in report.get("system_info", {}).values() for k, v in fields.items() if v != "0"}
    for backend in ("CUDA", "METAL"):
        if f"GGML_{backend}=ON" in args and not (
            report.get("gpu_offload") and backend.lower() in report.get("backends", [])
        ):
            return f"the build was asked for {backend} but has no {backend.lower()} backend", report
    if build.recipe in {"no-amx", "portable"} and "AMX_INT8" in features:
        return f"the {build.recipe} build still has AMX compiled in (CMAKE_ARGS not applied?)", report
    if build.recipe == "portable" and "AVX512" in features:
        return "the portable build still has AVX-512 compiled in (CMAKE_ARGS not applied?)", report
    return None, report


def smoke_command(python: Path, model: Path, build: Build) -> list[str]:
    cmd = [str(python), "-m", "edgespec.runtime.smoke", "--model", str(model), "--json"]
    args = build.cmake_args.upper().replace(" ", "")
    for backend in ("cuda", "metal"):
        if f"GGML_{backend.upper()}=ON" in args:
            cmd += ["--expect-backend", backend]
    return cmd


def default_target_file() -> Path:
    # The catalog names the default target; it is read by the venv, where the package now is.
    code = "from edgespec.models import catalog, store; "
    code += "print(store.model_file(catalog.default_name('target')))"
    out = subprocess.run([str(venv_python()), "-c", code], capture_output=True, text=True, check=False)
    path = out.stdout.strip()
    return Path(path) if out.returncode == 0 and path else home() / "models" / "qwen2.5-coder-1.5b.gguf"


def ensure_models() -> None:
    run([str(VENV / "bin" / "edgespec"), "models", "pull", "--default"])


def llama_cpp_source() -> Path:
    """Where llama.cpp's sources, as the llama-cpp-python sdist vendors them, are unpacked
    in the cache (the test set-up unpacks them, ``make setup-test``)."""
    return home() / "llama.cpp" / f"src-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"


def llama_spec() -> str:
    return f"llama-cpp-python=={LLAMA_CPP_VERSION}"


def wheels_home() -> Path:
    return home() / "wheels"


def ensure_build(build: Build) -> Path:
    """Build (or reuse) and install the wheel of ``build``; returns the wheel."""
    wheel = ensure_wheel(llama_spec(), build, wheel_dir_for(wheels_home(), build), venv_python())
    install_wheel(wheel, build, VENV, venv_python())
    ensure_installed(wheel.parent)
    return wheel


def record_smoke(report: dict) -> None:
    stamp = VENV / VENV_BUILD_INFO
    info = json.loads(stamp.read_text())
    info["smoke"] = {k: report.get(k) for k in ("text", "tokens_per_s", "buffers", "backends")}
    stamp.write_text(json.dumps(info, indent=1) + "\n")


def smoke_passed() -> bool:
    with contextlib.suppress(OSError, ValueError):
        return bool(json.loads((VENV / VENV_BUILD_INFO).read_text()).get("smoke"))
    return False


def verify_build(build: Build, wheel: Path) -> None:
    """Run the smoke check on the installed build; on failure mark its wheel failed and fall
    back, once, to the portable recipe."""
    if smoke_passed():
        return
    model = default_target_file()
    if not model.is_file():  # no model, no verdict: never blame (and rebuild) the build for it
        say(f"smoke check skipped: {model} is missing (run: make setup)")
        return
    reason, report = smoke_check(smoke_command(venv_python(), model, build), build)
    if reason is None:
        record_smoke(report)
        say(f"smoke check passed: {report.get('text', '')!r} at {report.get('tokens_per_s')} tokens/s")
        return
    mark_failed(wheel.parent, reason)
    if build.recipe == "portable":
        sys.exit(f"[setup] the portable llama.cpp build failed too: {reason}; see {wheel.parent}")
    say(f"the {build.recipe} llama.cpp build is unusable here: {reason}; rebuilding with the portable recipe")
    portable = Build.choose("portable")
    wheel = ensure_build(portable)
    reason, report = smoke_check(smoke_command(venv_python(), model, portable), portable)
    if reason is not None:
        mark_failed(wheel.parent, reason)
        sys.exit(f"[setup] the portable llama.cpp build failed too: {reason}; see {wheel.parent}")
    record_smoke(report)
    say(f"portable build passed the smoke check: {report.get('text', '')!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-models", action="store_true", help="skip pulling the default models")
    args = parser.parse_args()
    started = time.monotonic()
    ensure_venv()
    build = Build.choose()
    if build.recipe != "portable" and (wheel_dir_for(wheels_home(), build) / FAILED_MARKER).exists():
        say(f"the {build.recipe} build failed its smoke check earlier: using the portable recipe")
        build = Build.choose("portable")
    wheel = ensure_build(build)
    if not args.no_models:
        ensure_models()
        verify_build(build, wheel)
    say(f"ready in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
