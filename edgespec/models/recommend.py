"""Which catalog pair suits this machine: the largest target (with its first listed
draft) whose memory needs, KV cache of 4096 tokens included, fit the memory the backend
can use.

The memory a backend can use:

- a GPU backend with offload (CUDA, ROCm, Vulkan): 90% of the GPU's own memory, where
  its size can be read (``nvidia-smi``); the rest is the driver's and the display's;
- Metal (Apple's unified memory): 75% of the machine's memory, the share macOS lets one
  process keep on the GPU;
- the CPU: 80% of the machine's memory (or of the container's limit), the rest left to
  the system and the programs beside it.

The machine facts are read here (memory, GPU memory); the backend facts come from the
llama.cpp build (``runtime/system.py``) through the caller.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgespec.models import catalog
from edgespec.models.catalog import CatalogModel

GIB = 1 << 30
CPU_SHARE = 0.8
METAL_SHARE = 0.75
GPU_SHARE = 0.9


def total_memory_bytes() -> int:
    """This machine's memory, or its container's limit when that is lower; 0 if unknown."""
    total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if not total and platform.system() == "Darwin":
        out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, check=False)
        total = int(out.stdout.strip()) if out.stdout.strip().isdigit() else 0
    if not total:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit() and 0 < int(limit) < total:
            total = int(limit)
    except OSError:
        pass
    return total


def gpu_memory() -> tuple[int, str]:
    """(bytes, name) of the first NVIDIA GPU, or (0, "") where none can be read."""
    if not shutil.which("nvidia-smi"):
        return 0, ""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total,name", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        mib, name = out.stdout.splitlines()[0].split(",", 1)
        return int(float(mib)) << 20, name.strip()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0, ""


@dataclass(frozen=True)
class Machine:
    memory_bytes: int
    backends: tuple[str, ...]  # llama.cpp's compiled backends ("cpu", "cuda", "metal" …)
    gpu_offload: bool
    gpu_memory_bytes: int = 0
    gpu_name: str = ""


@dataclass(frozen=True)
class Budget:
    bytes: int
    where: str  # "GPU", "unified memory" or "memory"
    how: str  # one line: which share of what


def budget(machine: Machine) -> Budget:
    if machine.gpu_offload and "metal" in machine.backends:
        share = int(machine.memory_bytes * METAL_SHARE)
        return Budget(share, "unified memory", f"{METAL_SHARE:.0%} of {machine.memory_bytes / GIB:.1f} GiB")
    if machine.gpu_offload and machine.gpu_memory_bytes:
        share = int(machine.gpu_memory_bytes * GPU_SHARE)
        name = machine.gpu_name or "the GPU"
        return Budget(share, "GPU", f"{GPU_SHARE:.0%} of {name}'s {machine.gpu_memory_bytes / GIB:.1f} GiB")
    share = int(machine.memory_bytes * CPU_SHARE)
    return Budget(share, "memory", f"{CPU_SHARE:.0%} of {machine.memory_bytes / GIB:.1f} GiB")


@dataclass(frozen=True)
class Pair:
    target: CatalogModel
    draft: CatalogModel

    @property
    def memory_gib(self) -> float:
        return round(self.target.memory_gib + self.draft.memory_gib, 1)

    @property
    def download_bytes(self) -> int:
        return self.target.size + self.draft.size


def pairs() -> list[Pair]:
    """Every catalog target with its first listed draft, in catalog order."""
    models = catalog.all_models()
    found = []
    for model in models.values():
        drafts = [models[d] for d in model.drafts if d in models]
        if model.role == "target" and drafts and model.memory_gib:
            found.append(Pair(model, drafts[0]))
    return found


@dataclass(frozen=True)
class Recommendation:
    budget: Budget
    pair: Pair | None  # the largest target that fits; None when none does
    fitting: list[Pair]  # every pair that fits, largest first
    smallest: Pair | None


def recommend(machine: Machine) -> Recommendation:
    room = budget(machine)
    every = pairs()
    # Largest target first; among equals the catalog's order decides.
    fitting = sorted((p for p in every if p.memory_gib * GIB <= room.bytes), key=lambda p: -p.target.size)
    return Recommendation(
        budget=room,
        pair=fitting[0] if fitting else None,
        fitting=fitting,
        smallest=min(every, key=lambda p: p.memory_gib) if every else None,
    )


def pull_command(pair: Pair) -> str:
    return f"edgespec models pull {pair.target.name} {pair.draft.name}"


def run_command(pair: Pair) -> str:
    return f"edgespec chat --target {pair.target.name} --draft {pair.draft.name}"
