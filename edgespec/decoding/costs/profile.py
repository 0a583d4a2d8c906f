"""The cost profile on disk: how it is read and written, and what it is keyed by.

A profile's figures change with the CPU model and its instruction sets, the thread count,
the llama.cpp build, the exact model files and where their layers run (other machines'
workers included), so all of these key it: a profile is never used where it was not
measured. It is written atomically, so concurrent writers never leave half a file."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

from edgespec.models import catalog, store
from edgespec.models.speed import Speed, from_pass
from edgespec.runtime.model import Model
from edgespec.runtime.rpc import layout_key
from edgespec.runtime.system import build_fingerprint, cpu_flags, cpu_model, isa_of_interest

PROFILE_VERSION = 4  # the layout and method of the profile on disk: another version is measured again


def read_profile(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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


def profile_facts_for(target: str, draft: str | None, layout: str = "") -> dict[str, str]:
    """What a profile is keyed by, from the models' descriptions (``describe_model``) and
    the target's device layout (``rpc.layout_key``: its workers and split; a target split
    over machines has a cost curve of its own, the network's round trips in every pass)."""
    facts = {
        "cpu": cpu_model(),
        # A virtual machine's CPU name may give only the vendor and family, alike for hosts
        # with other instruction sets and other cost curves: the instruction sets tell them apart.
        "isa": " ".join(isa_of_interest(cpu_flags())),
        "cores": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "llama.cpp": build_fingerprint(),
        "target": target,
        "draft": draft or "none",
    }
    if layout:  # absent on one machine: the profiles measured before keep their keys
        facts["layout"] = layout
    return facts


def profile_facts(target: Model, draft: Model | None) -> dict[str, str]:
    def about(m: Model) -> str:
        return describe_model(m.name, m.path, m.options.n_gpu_layers, m.options.n_threads)

    layout = layout_key(target.options.rpc, target.options.tensor_split)
    return profile_facts_for(about(target), about(draft) if draft is not None else None, layout)


def profiles_dir() -> Path:
    return store.home() / "costs"


def profile_path_for(facts: dict[str, str], target_name: str, draft_name: str | None) -> Path:
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    name = target_name + (f"__{draft_name}" if draft_name else "")
    return profiles_dir() / f"{name}-{key}.json"


def profile_path(target: Model, draft: Model | None) -> Path:
    """One profile per model pair, machine, llama.cpp build, placement and thread count."""
    return profile_path_for(profile_facts(target, draft), target.name, draft.name if draft else None)


# -- what the profiles on disk say about this machine's speed ------------------------------

_MACHINE_KEYS = ("cpu", "isa", "cores")  # a profile measured where these match was measured here


def weights_bytes(name: str, identity: str) -> int:
    """The size of the model file a profile was measured with (``describe_model``'s name and
    file identity): the cached catalog file it names, else the catalog's size, else the
    size a "size-mtime" identity carries; 0 when unknown."""
    model = catalog.all_models().get(name)
    if model is not None:
        files = store.model_files(model)
        if files[0].is_file() and file_identity(files[0]) == identity:
            return sum(p.stat().st_size for p in files if p.is_file())
        return model.size
    stamped = re.fullmatch(r"(\d+)-\d+", identity)
    return int(stamped[1]) if stamped else 0


def _target_pass(data: dict) -> tuple[str, str, str, float] | None:
    """(name, file identity, threads, seconds of one single-token pass) of a profile's
    target, from its key (``describe_model``) and its curve; None where either is garbled."""
    facts, curve = data.get("facts"), data.get("target")
    if not isinstance(facts, dict) or not isinstance(curve, dict):
        return None
    parts = str(facts.get("target", "")).rsplit(" ", 3)
    try:
        seconds = float(curve.get("1", math.nan))
    except (TypeError, ValueError):
        return None
    if len(parts) != 4:
        return None
    name, identity, _placement, threads = parts
    return name, identity, threads, seconds


def profile_speed(data: dict, here: dict[str, str]) -> tuple[tuple, Speed] | None:
    """The speed one profile implies (its target's single-token pass over its file's size)
    with its rank among others, or None where it was measured elsewhere, is not to be
    trusted, names a file of unknown size or one too small to predict others by
    (``speed.from_pass``). Rank: the same llama.cpp build first, then every thread (as
    edgespec runs by default), then the largest model (the smaller a model, the more of its
    pass is fixed cost that a byte count does not scale), then the newest."""
    if data.get("version") != PROFILE_VERSION or data.get("provisional") or data.get("stale"):
        return None
    found = _target_pass(data)
    facts = data.get("facts") or {}
    # A target split over machines: its speed is the network's as much as this machine's.
    if found is None or facts.get("layout") or any(facts.get(k) != here.get(k) for k in _MACHINE_KEYS):
        return None
    name, identity, threads, seconds = found
    source = f"{name}'s cost profile ({seconds * 1e3:.0f} ms a token)"
    size = weights_bytes(name, identity)
    speed = from_pass(seconds, size, source)
    if speed is None:
        return None
    try:
        when = float(data.get("measured_at", 0.0))
    except (TypeError, ValueError):
        when = 0.0
    return (facts.get("llama.cpp") == here.get("llama.cpp"), threads == "threads=all", size, when), speed


def measured_speed(directory: Path | None = None) -> Speed | None:
    """Seconds per byte of weights for one decoded token on this machine, from the best of
    the cost profiles measured here (``profile_speed``); None where there is none."""
    here = profile_facts_for("", None)
    found = []
    for path in sorted((directory or profiles_dir()).glob("*.json")):
        data = read_profile(path)
        ranked = profile_speed(data, here) if data is not None else None
        if ranked is not None:
            found.append(ranked)
    return max(found, key=lambda r: r[0])[1] if found else None
