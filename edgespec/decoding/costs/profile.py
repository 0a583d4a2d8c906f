"""The cost profile on disk: how it is read and written, and what it is keyed by.

A profile's figures change with the CPU model and its instruction sets, the thread count,
the llama.cpp build, the exact model files and where their layers run, so all of these
key it: a profile is never used where it was not measured. It is written atomically, so
concurrent writers never leave half a file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from edgespec.models import store
from edgespec.runtime.model import Model
from edgespec.runtime.system import build_fingerprint, cpu_flags, cpu_model, isa_of_interest

PROFILE_VERSION = 4  # the layout and method of the profile on disk: another version is measured again


def read_profile(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_atomically(path: Path, text: str) -> None:
    """A unique temporary file in the same directory, then a rename: readers see the old
    file or the new one, never a mixture, whatever else writes at the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- what a profile is keyed by ------------------------------------------------------------


def file_identity(path: Path) -> str:
    """The exact file: its verified sha256 where the cache has one, else size and mtime."""
    stamp = store.read_stamp(path)
    if stamp is not None and stamp.matches(path):
        return stamp.sha256[:16]
    stat = path.stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def describe_model(name: str, path: Path, n_gpu_layers: int, n_threads: int | None) -> str:
    """One model's part of a profile's key: which file, where its layers run, how many threads."""
    return f"{name} {file_identity(path)} ngl={n_gpu_layers} threads={n_threads or 'all'}"


def profile_facts_for(target: str, draft: str | None) -> dict[str, str]:
    """What a profile is keyed by, from the models' descriptions (``describe_model``)."""
    return {
        "cpu": cpu_model(),
        # A virtual machine's CPU name may give only the vendor and family, alike for hosts
        # with other instruction sets and other cost curves: the instruction sets tell them apart.
        "isa": " ".join(isa_of_interest(cpu_flags())),
        "cores": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "llama.cpp": build_fingerprint(),
        "target": target,
        "draft": draft or "none",
    }


def profile_facts(target: Model, draft: Model | None) -> dict[str, str]:
    def about(m: Model) -> str:
        return describe_model(m.name, m.path, m.options.n_gpu_layers, m.options.n_threads)

    return profile_facts_for(about(target), about(draft) if draft is not None else None)


def profile_path_for(facts: dict[str, str], target_name: str, draft_name: str | None) -> Path:
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    name = target_name + (f"__{draft_name}" if draft_name else "")
    return store.home() / "costs" / f"{name}-{key}.json"


def profile_path(target: Model, draft: Model | None) -> Path:
    """One profile per model pair, machine, llama.cpp build, placement and thread count."""
    return profile_path_for(profile_facts(target, draft), target.name, draft.name if draft else None)
