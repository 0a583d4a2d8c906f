"""Facts about this machine and the llama.cpp build loaded in this process.

What a bug report needs, and what decides whether a build is safe to run here: the CPU and
the instruction sets that matter, the OS, what llama.cpp says it compiled in
(``llama_print_system_info``), and which backend libraries the wheel installed.

The decisions are pure functions of those facts (flag sets and parsed strings), so they can
be tested on any machine with the facts of another.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from pathlib import Path

import llama_cpp

from edgespec.bootstrap import VENV_BUILD_INFO as BUILD_RECORD  # written into the venv by `make setup`
from edgespec.host import cpu_flags, cpuinfo_text
from edgespec.runtime import devices

__all__ = ["cpu_flags", "cpuinfo_text"]

# The CPU features whose presence changes which llama.cpp kernels run (x86 /proc/cpuinfo
# names, and the arm64 ones that matter to ggml).
ISA_OF_INTEREST = (
    "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vbmi", "avx512_vnni",
    "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16",
)  # fmt: skip
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
# The flag that names each vector extension, widest first (see widest_isa).
_WIDEST_FIRST = (
    ("amx_tile", "AVX-512 + AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"),
    ("sve", "SVE"), ("asimd", "NEON"),
)  # fmt: skip
_BUFFER_LINE = re.compile(r"(\S+) model buffer size\s*=\s*([0-9.]+)\s*MiB")


def cpu_model(text: str | None = None) -> str:
    text = cpuinfo_text() if text is None else text
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in {"model name", "cpu model", "hardware"} and ":" in line:
            return line.split(":", 1)[1].strip()
    if platform.system() == "Darwin":
        import subprocess

        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=False
        )
        if out.stdout.strip():
            return out.stdout.strip()
    return platform.processor() or platform.machine()


def cpu_has_amx(flags: frozenset[str] | set[str]) -> bool:
    return bool(AMX_FLAGS & set(flags))


def isa_of_interest(flags: frozenset[str] | set[str]) -> list[str]:
    return [f for f in ISA_OF_INTEREST if f in flags]


def widest_isa(flags: frozenset[str] | set[str]) -> str:
    """The widest vector extension in one word ("AVX-512 + AMX", "AVX2", ...): it sets the
    shape of the cost curve, and a VM's model name ("AMD EPYC") may not tell it."""
    return next((name for flag, name in _WIDEST_FIRST if flag in flags), "scalar")


def os_name() -> str:
    if platform.system() == "Darwin":
        return f"macOS {platform.mac_ver()[0]} ({platform.machine()})"
    return f"{platform.system()} {platform.release()} ({platform.machine()})"


def parse_system_info(info: bytes | str) -> dict[str, dict[str, str]]:
    """``"CPU : SSE3 = 1 | AVX2 = 1 | ... | Metal : EMBED_LIBRARY = 1 |"`` as
    ``{"CPU": {"SSE3": "1", "AVX2": "1", ...}, "Metal": {...}}``."""
    text = info.decode("utf-8", errors="replace") if isinstance(info, bytes) else info
    result: dict[str, dict[str, str]] = {}
    section = "CPU"
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        if " : " in part or part.endswith(" :"):
            head, _, part = part.partition(":")
            section = head.strip()
            part = part.strip()
            if not part:
                result.setdefault(section, {})
                continue
        key, _, value = part.partition("=")
        result.setdefault(section, {})[key.strip()] = value.strip() or "1"
    return result


def system_info() -> dict[str, dict[str, str]]:
    return parse_system_info(llama_cpp.llama_print_system_info())


def build_fingerprint() -> str:
    """The llama.cpp build in one line: its version and a hash of what it compiled in (a
    cost profile measured with one build says little about another)."""
    compiled = json.dumps(system_info(), sort_keys=True).encode()
    return f"{llama_cpp.__version__} {hashlib.sha256(compiled).hexdigest()[:12]}"


def build_record() -> dict[str, object] | None:
    """How `make setup` built the llama.cpp in this environment (recipe, CMake arguments,
    cache key), or None where it left no record (an install by other means)."""
    try:
        record = json.loads((Path(sys.prefix) / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def compiled_features(info: dict[str, dict[str, str]]) -> set[str]:
    """The features compiled in and enabled, e.g. {"AVX2", "AVX512", "REPACK"}."""
    return {key for fields in info.values() for key, value in fields.items() if value not in {"0", ""}}


def library_has_amx(info: dict[str, dict[str, str]]) -> bool:
    return any(f.startswith("AMX") for f in compiled_features(info))


def needs_amx_guard(info: dict[str, dict[str, str]], flags: frozenset[str] | set[str]) -> bool:
    """Whether ggml's AMX buffer type would run here: the library compiled it in and the CPU
    has AMX. That combination repacks Q4_K/Q6_K weights in a way that crashed at the first
    decode (llama.cpp issue 20824), so the model loader must turn extra buffer types off."""
    return library_has_amx(info) and cpu_has_amx(flags)


def library_dir() -> Path:
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def backend_libraries(lib_dir: Path | None = None) -> list[str]:
    """The ggml backends the wheel installed, from its libggml-<name> libraries
    ("cpu", "cuda", "metal", "blas" ...); ggml-base is the common core, not a backend."""
    lib_dir = library_dir() if lib_dir is None else lib_dir
    names = set()
    for path in lib_dir.glob("libggml-*"):
        if path.suffix not in {".so", ".dylib", ".dll"} and ".so." not in path.name:
            continue
        name = path.name.removeprefix("libggml-").split(".", 1)[0]
        if name != "base":
            names.add(name)
    return sorted(names)


def backends(info: dict[str, dict[str, str]] | None = None, lib_dir: Path | None = None) -> list[str]:
    """Backends available: the installed libraries plus those system info names (Metal is
    often linked into libggml itself)."""
    info = system_info() if info is None else info
    found = set(backend_libraries(lib_dir))
    for section in info:
        name = section.strip().lower()
        if name and name not in {"cpu"}:
            found.add(name)
    found.add("cpu")
    return sorted(found)


def gpu_offload() -> bool:
    # Not llama_supports_gpu_offload: that is true in any build with the RPC backend.
    return devices.has_gpu()


def parse_buffer_line(line: str) -> tuple[str, float] | None:
    """``"load_tensors:   CPU_REPACK model buffer size =   123.45 MiB"`` → ("CPU_REPACK", 123.45)."""
    match = _BUFFER_LINE.search(line)
    return (match.group(1), float(match.group(2))) if match else None


def facts() -> dict[str, object]:
    """Everything above in one JSON-ready dict."""
    text = cpuinfo_text()
    flags = cpu_flags(text)
    info = system_info()
    return {
        "os": os_name(),
        "cpu": cpu_model(text),
        "isa": isa_of_interest(flags),
        "cpu_amx": cpu_has_amx(flags),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "system_info": info,
        "library_amx": library_has_amx(info),
        "gpu_offload": gpu_offload(),
        "backends": backends(info),
    }


def gpu_offload_available() -> bool:
    return devices.has_gpu()


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no sched_getaffinity
        return max(1, os.cpu_count() or 1)
