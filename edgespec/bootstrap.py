"""``make setup``: everything a fresh machine needs, and seconds on a ready one.

Runs with the system Python and the standard library only (nothing is installed yet):

1. a virtual environment in ``.venv``;
2. ``llama-cpp-python`` built from source once (minutes) and its wheel cached under
   ``$EDGESPEC_HOME/wheels/<key>``, the key covering everything that changes the binary
   (version, CMAKE_ARGS, Python, OS, CPU architecture and instruction-set flags);
3. the package installed into the venv, skipped when ``pyproject.toml`` and the wheel
   are unchanged since the last install;
4. the default model pair pulled and verified (``edgespec models pull --default``);
5. with ``--browser``: Debian's Chromium for the browser test, where it can be installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
LLAMA_CPP_VERSION = "0.3.36"
CHROMIUM = Path("/usr/bin/chromium")


def say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def home() -> Path:
    return Path(os.environ.get("EDGESPEC_HOME") or Path.home() / ".cache" / "edgespec")


def venv_python() -> Path:
    return VENV / "bin" / "python"


def run(cmd: list[str], **kwargs) -> None:
    result = subprocess.run(cmd, check=False, **kwargs)
    if result.returncode != 0:
        sys.exit(f"[setup] failed ({result.returncode}): {' '.join(map(str, cmd))}")


def cpu_flags() -> str:
    """The instruction sets the native build may use: a wheel built for AVX-512 must not
    be reused on a CPU without it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def wheel_key() -> str:
    facts = {
        "llama-cpp-python": LLAMA_CPP_VERSION,
        "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", ""),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu": hashlib.sha256(cpu_flags().encode()).hexdigest()[:16],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


def ensure_venv() -> None:
    # This runs on the system Python, which may be older than the package requires.
    if sys.version_info < (3, 11):  # noqa: UP036
        sys.exit(f"[setup] edgespec needs Python >= 3.11 (this is {platform.python_version()})")
    if not venv_python().exists():
        say(f"creating virtual environment {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
        run([str(venv_python()), "-m", "pip", "install", "-q", "--upgrade", "pip", "wheel"])


def ensure_llama_wheel() -> Path:
    wheel_dir = home() / "wheels" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{wheel_key()}"
    if list(wheel_dir.glob("llama_cpp_python-*.whl")):
        return wheel_dir
    say(
        f"building llama-cpp-python {LLAMA_CPP_VERSION} from source (about 7 minutes on 2 cores; "
        f"once: the wheel is cached in {wheel_dir})"
    )
    wheel_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=wheel_dir.parent) as tmp:
        run([str(venv_python()), "-m", "pip", "wheel", "--no-deps", "--no-binary", "llama-cpp-python",
             "-w", tmp, f"llama-cpp-python=={LLAMA_CPP_VERSION}"])  # fmt: skip
        staged = Path(tmp) / "ready"
        staged.mkdir()
        for whl in Path(tmp).glob("*.whl"):
            whl.rename(staged / whl.name)
        shutil.rmtree(wheel_dir, ignore_errors=True)
        staged.rename(wheel_dir)  # atomic: a half-built wheel never looks cached
    say(f"built llama-cpp-python in {time.monotonic() - started:.0f} s")
    return wheel_dir


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


def ensure_models() -> None:
    run([str(VENV / "bin" / "edgespec"), "models", "pull", "--default"])


def ensure_browser() -> None:
    if CHROMIUM.exists():
        return
    if shutil.which("apt-get") is None:
        say("no apt-get here: the browser test will be skipped")
        return
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    say("installing Debian's chromium for the browser test")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([*prefix, "apt-get", "update", "-qq"],
                [*prefix, "apt-get", "install", "-y", "-qq", "chromium"]):  # fmt: skip
        if subprocess.run(cmd, env=env, check=False, stdout=subprocess.DEVNULL).returncode != 0:
            say(f"'{' '.join(cmd)}' failed: the browser test will be skipped")
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--browser", action="store_true", help="also install Chromium for UI tests")
    parser.add_argument("--no-models", action="store_true", help="skip pulling the default models")
    args = parser.parse_args()
    started = time.monotonic()
    ensure_venv()
    ensure_installed(ensure_llama_wheel())
    if not args.no_models:
        ensure_models()
    if args.browser:
        ensure_browser()
    say(f"ready in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
