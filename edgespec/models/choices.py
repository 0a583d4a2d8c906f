"""The models a person can pick from, one line each: the catalog's pairs, the small
catalog models that run alone, the GGUFs already on disk that the catalog does not
name (hub downloads), and the GGUFs other programs keep on this computer or a person's
folders hold (``local.py``: LM Studio, Ollama, Jan, the Hugging Face cache, llama.cpp's
cache), with what each costs to get, whether it fits this machine's memory, how fast it
runs here, and which one ``edgespec models recommend`` would suggest. A file that cannot
be used is listed with its ``problem``, last, so a person sees why it is not offered.

Nothing here touches the network: what is on disk is what the verified cache says
(``store.cached``), sizes are the catalog's or the files', rates are measured here
(``measured.py``) or predicted from this machine's speed (``speed.py``), which the caller
gives (it comes from the cost profiles, a layer above, or the memory probe).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models import catalog, hubref, recommend, store
from edgespec.models.catalog import CatalogModel
from edgespec.models.download import FILE_PREFIX
from edgespec.models.gguf import kv_bytes_per_token, read_info
from edgespec.models.local import LocalModel, find_local_models, local_draft, real_path
from edgespec.models.measured import measured_rate
from edgespec.models.pairing import choose_draft
from edgespec.models.resolve import ResolvedModel
from edgespec.models.speed import Speed, floors, format_rate, probe_speed

# What the catalog's memory figures add to a file's bytes (catalog.toml's header): a KV
# cache of this many tokens and this much for compute buffers.
KV_TOKENS = 4096
COMPUTE_BYTES = 1 << 29


@dataclass(frozen=True)
class ModelChoice:
    key: str  # what the app passes back: the catalog target name, or "file:<path>"
    target: str  # catalog name or path
    draft: str | None  # catalog name (or path) of its draft; None: lookups only
    label: str  # one line for a dropdown
    download_bytes: int  # bytes still to download for target and draft (0 when on disk)
    size_bytes: int  # target and draft together
    on_disk: bool
    fits: bool  # fits this machine's memory (recommend.py's budget)
    recommended: bool  # what `edgespec models recommend` would suggest
    rate: float | None  # tokens/s: measured here if it ran, else estimated
    rate_measured: bool
    memory_bytes: int = 0  # memory to run it (KV cache of 4096 tokens included); 0: unknown
    problem: str | None = None  # why it cannot be used (one line); None: it can


def model_choices(
    speed: Speed | None = None,
    machine: recommend.Machine | None = None,
    *,
    extra_dirs: Iterable[Path] = (),
) -> list[ModelChoice]:
    """Every model to pick from: on-disk ones first, then by size, smallest first; those
    that cannot be used last.

    ``speed``: this machine's seconds per byte, from a cost profile measured here
    (``decoding.costs.measured_speed()``); None: on a CPU the memory probe's, as
    `models recommend` does (``_probed_speed``), and no estimate with GPU offload.
    ``machine``: its memory and backend (default: this machine's memory, the CPU's budget;
    a GPU build passes its own, as ``cli/models.py``'s ``_machine`` makes it).
    ``extra_dirs``: folders a person named, searched for GGUFs beside the programs' own
    (``local.LocalFolders.dirs``)."""
    machine = machine or recommend.Machine(recommend.total_memory_bytes(), ("cpu",), False)
    if speed is None and not machine.gpu_offload:
        speed = _probed_speed()
    context = _Context(machine, speed)
    found = [_pair_choice(pair, context) for pair in recommend.pairs()]
    found += [_alone_choice(model, context) for model in _alone_models()]
    disk = _files_on_disk()
    found += [choice for path in disk if (choice := _file_choice(path, context))]
    found += _local_choices(context, extra_dirs, disk)
    return sorted(found, key=lambda c: (c.problem is not None, not c.on_disk, c.size_bytes, c.key))


REPROBE_SECONDS = 300.0  # a listing probes again at most this often


@dataclass
class _Probes:
    best: Speed | None = None
    at: float = -math.inf


_probes = _Probes()
_probe_lock = threading.Lock()


def _probed_speed() -> Speed | None:
    """The memory probe's speed, the best seen in this process: another process (or this
    one's answer) decoding meanwhile only slows a probe, so the fastest is the least
    disturbed. Probed again at most every ``REPROBE_SECONDS``: a second and 256 MB of
    reads, which a listing refreshed after every download or switch should not pay."""
    with _probe_lock:
        if time.monotonic() - _probes.at >= REPROBE_SECONDS:
            _probes.at = time.monotonic()
            found = probe_speed()
            if found is not None and (
                _probes.best is None or found.seconds_per_byte < _probes.best.seconds_per_byte
            ):
                _probes.best = found
        return _probes.best


class _Context:
    """What every choice is judged by, each looked up once per listing."""

    def __init__(self, machine: recommend.Machine, speed: Speed | None):
        self.speed = speed
        self.room = recommend.budget(machine)
        advice = recommend.recommend(machine, speed, floors().rates[floors().default])
        self.recommended = advice.pair if machine.memory_bytes else None
        self._cached: dict[str, Path | None] = {}

    def cached(self, model: CatalogModel) -> Path | None:
        if model.name not in self._cached:
            self._cached[model.name] = store.cached(model)
        return self._cached[model.name]

    def fits(self, memory_bytes: int) -> bool:
        """Unknown needs (0), or an unknown memory size, are not held against a model."""
        return not self.room.bytes or memory_bytes <= self.room.bytes

    def rate(self, path: Path | None, model_bytes: int) -> tuple[float | None, bool]:
        """(tokens/s, measured): what the file measured here, else the prediction."""
        measured = measured_rate(path) if path is not None else None
        if measured is not None:
            return measured, True
        return (self.speed.rate_for_bytes(model_bytes) if self.speed else None), False


def _pair_choice(pair: recommend.Pair, context: _Context) -> ModelChoice:
    target_file, draft_file = context.cached(pair.target), context.cached(pair.draft)
    missing = [m for m, f in ((pair.target, target_file), (pair.draft, draft_file)) if f is None]
    rate, measured = context.rate(target_file, pair.target.size)
    memory = int(pair.memory_gib * recommend.GIB)
    choice = ModelChoice(
        key=pair.target.name,
        target=pair.target.name,
        draft=pair.draft.name,
        label="",
        download_bytes=sum(m.size for m in missing),
        size_bytes=pair.download_bytes,
        on_disk=not missing,
        fits=context.fits(memory),
        recommended=pair == context.recommended,
        rate=rate,
        rate_measured=measured,
        memory_bytes=memory,
    )
    return _labelled(choice, f"{pair.target.name} + {_short_draft(pair.target.name, pair.draft.name)} draft")


def _alone_models() -> list[CatalogModel]:
    """Catalog models that run as a target with no draft model: small ones of role
    "any" or "target" that no pair is made of (SmolLM2, Gemma 3 270M)."""
    paired = {p.target.name for p in recommend.pairs()}
    return [
        m
        for m in catalog.all_models().values()
        if m.role in ("any", "target") and m.name not in paired and not m.drafts and m.memory_gib
    ]


def _alone_choice(model: CatalogModel, context: _Context) -> ModelChoice:
    path = context.cached(model)
    rate, measured = context.rate(path, model.size)
    memory = int(model.memory_gib * recommend.GIB)
    choice = ModelChoice(
        key=model.name,
        target=model.name,
        draft=None,
        label="",
        download_bytes=0 if path else model.size,
        size_bytes=model.size,
        on_disk=path is not None,
        fits=context.fits(memory),
        recommended=False,
        rate=rate,
        rate_measured=measured,
        memory_bytes=memory,
    )
    return _labelled(choice, f"{model.name} alone")


# -- GGUFs on disk that the catalog does not name -------------------------------------------


def _files_on_disk() -> list[Path]:
    """The first file of every verified hub download (stamped, a language model, not a
    later part of a split one), and GGUFs in the models folder under no catalog name."""
    found = []
    if store.hub_dir().is_dir():
        found += [p for p in sorted(store.hub_dir().rglob("*.gguf")) if _first_model_file(p)]
    if store.models_dir().is_dir():
        names = set(catalog.all_models())
        for path in sorted(store.models_dir().glob("*.gguf")):
            if hubref.model_stem(path.name) not in names and _first_model_file(path):
                found.append(path)
    return found


def _first_model_file(path: Path) -> bool:
    info = hubref.split_info(path.name)
    first = info is None or info[1] == 1
    return first and hubref.is_model_file(path.name) and store.stamped(path) is not None


def _file_bytes(path: Path) -> int:
    """Bytes of a model, every part of a split one counted."""
    parts = [path.with_name(p) for p in hubref.split_parts(path.name)]
    return sum(p.stat().st_size for p in parts if p.is_file())


def _file_memory(path: Path, model_bytes: int) -> int:
    """What the catalog's memory figure would be: bytes, a KV cache of 4096 tokens and
    the compute buffers (the KV cache from the header; 0 for all of it when unreadable)."""
    try:
        return model_bytes + kv_bytes_per_token(read_info(path)) * KV_TOKENS + COMPUTE_BYTES
    except (EdgespecError, OSError, ValueError, TypeError):
        return 0


def _file_choice(path: Path, context: _Context) -> ModelChoice | None:
    try:
        model_bytes = _file_bytes(path)
    except OSError:
        return None  # gone since it was listed
    try:
        draft = _file_draft(path)
    except (EdgespecError, OSError):
        draft = None  # a header that cannot be read: loading it will say why
    memory = _file_memory(path, model_bytes)
    draft_bytes = _file_bytes(draft.path) if draft else 0
    if draft is not None:
        memory = memory + (_draft_memory(draft) if memory else 0)
    rate, measured = context.rate(path, model_bytes)
    name = _hub_name(path)
    choice = ModelChoice(
        key=f"{FILE_PREFIX}{path}",
        target=str(path),
        draft=(draft.name if draft.entry else str(draft.path)) if draft else None,
        label="",
        download_bytes=0,
        size_bytes=model_bytes + draft_bytes,
        on_disk=True,
        fits=context.fits(memory),
        recommended=False,
        rate=rate,
        rate_measured=measured,
        memory_bytes=memory,
    )
    draft_text = f" + {_short_draft(name, draft.name)} draft" if draft else " alone"
    return _labelled(choice, name + draft_text)


def _file_draft(path: Path) -> ResolvedModel | None:
    """The draft a pair with this file as its target would get: a cached catalog draft or
    hub download of the same vocabulary (pairing's rule), never a download."""
    entry = _hub_entry(path)
    target = ResolvedModel(path=path, name=hubref.model_stem(path.name), entry=entry)
    return choose_draft(target, download=False).draft


def _draft_memory(draft: ResolvedModel) -> int:
    if draft.entry is not None and draft.entry.memory_gib:
        return int(draft.entry.memory_gib * recommend.GIB)
    return _file_memory(draft.path, _file_bytes(draft.path))


def _hub_entry(path: Path) -> CatalogModel | None:
    """The catalog model a hub download is the hub file of, if any."""
    try:
        relative = path.relative_to(store.hub_dir()).parts
    except ValueError:
        return None
    if len(relative) < 3:
        return None
    return catalog.find_hub_file("/".join(relative[:2]), "/".join(relative[2:]))


def _hub_name(path: Path) -> str:
    """How a file on disk is named in the list: owner/repo/stem for a hub download."""
    try:
        relative = path.relative_to(store.hub_dir()).parts
    except ValueError:
        return hubref.model_stem(path.name)
    return "/".join([*relative[:2], hubref.model_stem(relative[-1])])


# -- GGUFs other programs keep, and a person's folders (local.py) ------------------------------


@dataclass(frozen=True)
class _Draft:
    arg: str  # what the pair is loaded with: a file's path, or a catalog name
    name: str  # as the label says it
    size: int
    memory: int


def _local_choices(context: _Context, extra_dirs: Iterable[Path], listed: list[Path]) -> list[ModelChoice]:
    """The models found on this computer, less those listed above already: the same real
    file as a verified cached one is that one."""
    known = {real_path(path) for path in listed}
    for model in catalog.all_models().values():
        if (path := context.cached(model)) is not None:
            known.add(real_path(path))
    models = [m for m in find_local_models(extra_dirs) if m.identity not in known]
    return [_local_choice(model, models, context) for model in models]


def _local_choice(model: LocalModel, models: list[LocalModel], context: _Context) -> ModelChoice:
    name = f"{model.name} ({model.where})"
    if model.problem is not None:
        return _unusable_choice(model, name)
    draft = _local_pair_draft(model, models)
    memory = _file_memory(model.path, model.size_bytes)
    if draft is not None and memory:
        memory += draft.memory
    rate, measured = context.rate(model.path, model.size_bytes)
    choice = ModelChoice(
        key=f"{FILE_PREFIX}{model.path}",
        target=str(model.path),
        draft=draft.arg if draft else None,
        label="",
        download_bytes=0,
        size_bytes=model.size_bytes + (draft.size if draft else 0),
        on_disk=True,
        fits=context.fits(memory),
        recommended=False,
        rate=rate,
        rate_measured=measured,
        memory_bytes=memory,
    )
    mine = model.name.rsplit("/", 1)[-1]
    return _labelled(choice, name + (f" + {_short_draft(mine, draft.name)} draft" if draft else " alone"))


def _local_pair_draft(model: LocalModel, models: list[LocalModel]) -> _Draft | None:
    """The smallest model found beside it that can draft for it, else the draft pairing
    takes from the verified cache (never a download), else None: lookups alone."""
    found = local_draft(model, models)
    if found is not None:
        memory = _file_memory(found.path, found.size_bytes)
        return _Draft(str(found.path), found.name.rsplit("/", 1)[-1], found.size_bytes, memory)
    try:
        cached = choose_draft(ResolvedModel(path=model.path, name=model.name), download=False).draft
    except (EdgespecError, OSError):
        return None  # a header that cannot be read now: loading it will say why
    if cached is None:
        return None
    arg = cached.name if cached.entry else str(cached.path)
    return _Draft(arg, cached.name, _file_bytes(cached.path), _draft_memory(cached))


def _unusable_choice(model: LocalModel, name: str) -> ModelChoice:
    """Listed so that a person sees why the file is not offered; picking it refuses."""
    size = f" · {_bytes_text(model.size_bytes)}" if model.size_bytes else ""
    return ModelChoice(
        key=f"{FILE_PREFIX}{model.path}",
        target=str(model.path),
        draft=None,
        label=f"{name}{size} · cannot be used: {model.problem}",
        download_bytes=0,
        size_bytes=model.size_bytes,
        on_disk=True,
        fits=False,
        recommended=False,
        rate=None,
        rate_measured=False,
        problem=model.problem,
    )


# -- the label ------------------------------------------------------------------------------


def _short_draft(target: str, draft: str) -> str:
    """The draft's name without what it shares with the target's, word by word:
    qwen2.5-coder-1.5b + qwen2.5-coder-0.5b → "0.5b"."""
    mine, theirs = target.split("-"), draft.split("-")
    shared = 0
    while shared < min(len(mine), len(theirs)) - 1 and mine[shared] == theirs[shared]:
        shared += 1
    return "-".join(theirs[shared:])


def _bytes_text(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{max(1, round(n / 1e6))} MB"


def _labelled(choice: ModelChoice, name: str) -> ModelChoice:
    parts: list[str] = [name, _bytes_text(choice.size_bytes)]
    parts.append("on disk" if choice.on_disk else f"{_bytes_text(choice.download_bytes)} to download")
    if choice.rate is not None:
        how = "measured" if choice.rate_measured else "estimated"
        parts.append(f"~{format_rate(choice.rate)} tok/s ({how})")
    if not choice.fits:
        parts.append(f"does not fit memory (needs {choice.memory_bytes / recommend.GIB:.1f} GiB)")
    if choice.recommended:
        parts.append("recommended")
    return replace(choice, label=" · ".join(parts))


__all__ = ["FILE_PREFIX", "ModelChoice", "model_choices"]
