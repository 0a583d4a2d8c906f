"""Which catalog pair suits this machine: the largest target (with its first listed
draft) whose memory needs, KV cache of 4096 tokens included, fit the memory the backend
can use, and which decodes fast enough to use.

The memory a backend can use:

- a GPU backend with offload (CUDA, ROCm, Vulkan): 90% of the GPU's own memory, where
  its size can be read (``nvidia-smi``); the rest is the driver's and the display's;
- Metal (Apple's unified memory): 75% of the machine's memory, the share macOS lets one
  process keep on the GPU;
- the CPU: 80% of the machine's memory (or of the container's limit), the rest left to
  the system and the programs beside it.

Fast enough: where this machine's seconds per byte of weights are known (``speed.py``:
from a cost profile measured here, or a memory probe), a pair qualifies when its target
alone decodes at the floor's rate or faster, before speculation (which speeds decoding
up by an amount no recommendation can know in advance). Where they are not known (a GPU
backend, whose memory bandwidth nothing here measures), memory alone decides.

The machine facts are read here (memory, GPU memory); the backend facts come from the
llama.cpp build (``runtime/system.py``) and the speed from the cost profiles
(``decoding/costs``) through the caller.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from edgespec.models import catalog
from edgespec.models.catalog import CatalogModel
from edgespec.models.speed import Speed, format_rate

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
    """The pair for this machine, and what it was chosen among and by."""

    budget: Budget
    pair: Pair | None  # the largest pair that fits and reaches the floor, else the fastest that fits
    fitting: list[Pair]  # every pair that fits memory, largest first
    smallest: Pair | None
    speed: Speed | None = None  # None: memory alone decides
    floor: float = 0.0  # tokens/s the target must decode at alone, before speculation

    def rate(self, pair: Pair) -> float | None:
        """The target's predicted tokens/s before speculation; None where not predicted."""
        return self.speed.rate(pair.target) if self.speed is not None else None

    def pick_at(self, floor: float) -> Pair | None:
        """The pair this machine gets at ``floor`` tokens/s."""
        return _choose(self.fitting, self.speed, floor)

    @property
    def below_floor(self) -> bool:
        """No pair that fits reaches the floor: the pair is the fastest that fits."""
        rate = self.rate(self.pair) if self.pair is not None else None
        return rate is not None and rate < self.floor

    @property
    def passed_over(self) -> Pair | None:
        """The largest pair that fits memory, where the floor chose a smaller one."""
        if self.pair is None or self.fitting[0].target.size <= self.pair.target.size:
            return None
        return self.fitting[0]


def _choose(fitting: list[Pair], speed: Speed | None, floor: float) -> Pair | None:
    """The first of ``fitting`` (largest first) whose target decodes at ``floor`` or faster
    (or whose rate cannot be predicted: its size is unknown); where none does, the fastest
    (the smallest target; among equals the catalog's order)."""
    for pair in fitting:
        rate = speed.rate(pair.target) if speed is not None else None
        if rate is None or rate >= floor:
            return pair
    return min(fitting, key=lambda p: p.target.size) if fitting else None


def recommend(machine: Machine, speed: Speed | None = None, floor: float = 0.0) -> Recommendation:
    """The largest pair that fits ``machine``'s memory and, where ``speed`` is known,
    decodes at ``floor`` tokens/s or faster before speculation."""
    room = budget(machine)
    every = pairs()
    # Largest target first; among equals the catalog's order decides.
    fitting = sorted((p for p in every if p.memory_gib * GIB <= room.bytes), key=lambda p: -p.target.size)
    advice = Recommendation(
        budget=room,
        pair=None,
        fitting=fitting,
        smallest=min(every, key=lambda p: p.memory_gib) if every else None,
        speed=speed,
        floor=floor,
    )
    return replace(advice, pair=advice.pick_at(floor))


def trade(advice: Recommendation, quality_floor: float) -> str | None:
    """One line on what the floor gives up: the largest pair that fits memory but decodes
    below it, its rate, and the option that picks it (``--for quality`` when its floor,
    ``quality_floor``, lets it through; else the pair that option would pick, and the
    ``--min-rate`` that picks the largest)."""
    big = advice.passed_over
    rate = advice.rate(big) if big is not None else None
    if big is None or rate is None:
        return None
    thinks = " (and its answers open with thinking text)" if big.target.thinking else ""
    line = f"{big.target.name} fits memory but would answer at about {format_rate(rate)} tokens/s{thinks}"
    if advice.floor > quality_floor and rate >= quality_floor:
        return f"{line}; `--for quality` picks it"
    middle = advice.pick_at(quality_floor) if advice.floor > quality_floor else None
    if middle is not None and middle != advice.pair:
        middle_rate = format_rate(advice.rate(middle) or 0.0)
        line += f"; `--for quality` picks {middle.target.name} (about {middle_rate} tokens/s)"
    return f"{line}; `--min-rate {math.floor(rate * 10) / 10:g}` picks it"


def pull_command(pair: Pair) -> str:
    return f"edgespec models pull {pair.target.name} {pair.draft.name}"


def run_command(pair: Pair) -> str:
    return f"edgespec chat --target {pair.target.name} --draft {pair.draft.name}"
