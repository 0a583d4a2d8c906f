"""GGUF models already on this computer, kept by other programs: LM Studio, Ollama, Jan,
the Hugging Face hub cache, llama.cpp's own cache, and folders a person names
(``--models-dir``, the app's folder box).

Files are used where they are, never copied: a model's ``path`` is the file llama.cpp
opens (a split model's first part; Ollama's weights blob), as found, not resolved, so
that llama.cpp still finds a split model's other parts beside the first.

Everything here reads the filesystem and GGUF headers only, never the network. A file
that cannot be used (gone, unreadable, not a GGUF, a split model missing a part) is
still listed, with a one-line ``problem``, so a person sees why it is not offered;
vision projectors are not models to run, and are left out.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models import hubref
from edgespec.models.gguf import read_info
from edgespec.models.pairing import MAX_DRAFT_SHARE
from edgespec.models.vocab import gguf_difference

# Header architectures of vision projectors (mmproj files): llama.cpp's "clip", and the
# name newer multimodal builds use.
PROJECTOR_ARCHS = frozenset({"clip", "mtmd"})
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"  # Ollama's own models, named without it ("llama3.2:3b")
# How deep a folder is searched: the programs keep models two or three folders down,
# and a person who names their home folder by mistake should not wait for all of it.
MAX_DEPTH = 6


@dataclass(frozen=True)
class Folder:
    """A folder to look in: ``kind`` "files" (every GGUF under it), "hub" (the Hugging
    Face cache's layout) or "ollama" (manifests naming blobs)."""

    where: str  # said in the list: "LM Studio", "~/models"
    root: Path
    kind: str = "files"


@dataclass(frozen=True)
class LocalModel:
    path: Path  # the file llama.cpp opens, as found (an Ollama model's manifest when broken)
    name: str  # as listed: a file's stem, "llama3.2:3b", "owner/repo/stem"
    where: str  # the program or folder it was found in
    size_bytes: int  # every part of a split model counted
    identity: Path  # the real file (links resolved): listed once however it is reached
    problem: str | None = None  # why it cannot be used, one line; None: it can

    @property
    def usable(self) -> bool:
        return self.problem is None


class LocalFolders:
    """The folders a person added, each once, in the order given: the app keeps one for
    its lifetime, and a folder box adds to it while the app runs."""

    def __init__(self, dirs: Iterable[Path] = ()):
        # Given at start (``--models-dir``): a folder missing now (a drive not mounted)
        # is still kept, and simply holds nothing until it is back.
        self._dirs: list[Path] = []
        for path in dirs:
            self._keep(Path(path).expanduser().absolute())

    def add(self, path: Path | str) -> Path:
        """Add a folder a person typed; a one-line EdgespecError when it is none."""
        text = str(path).strip()
        if not text:
            raise EdgespecError("name a folder that holds GGUF files")
        folder = Path(text).expanduser().absolute()
        if not folder.is_dir():
            raise EdgespecError(f"not a folder: {folder}")
        self._keep(folder)
        return folder

    @property
    def dirs(self) -> list[Path]:
        return list(self._dirs)  # a copy: the app's threads list while another adds

    def _keep(self, folder: Path) -> None:
        if folder not in self._dirs:
            self._dirs.append(folder)


def find_local_models(extra_dirs: Iterable[Path] = ()) -> list[LocalModel]:
    """Every model in the programs' folders and in ``extra_dirs``, each real file once
    (the first folder that reaches it names it), in the folders' order."""
    seen: set[Path] = set()
    found: list[LocalModel] = []
    for folder in [*app_folders(), *(Folder(_where(Path(d)), Path(d)) for d in extra_dirs)]:
        for model in _scan(folder):
            if model.identity not in seen:
                seen.add(model.identity)
                found.append(model)
    return found


def local_draft(target: LocalModel, models: Iterable[LocalModel]) -> LocalModel | None:
    """The smallest usable model among ``models`` that can draft for ``target``: at most
    half its size (pairing's rule) and of the same vocabulary (llama.cpp's rule, from
    the headers), else None."""
    limit = target.size_bytes * MAX_DRAFT_SHARE
    candidates = sorted(
        (m for m in models if m.usable and m.identity != target.identity and m.size_bytes <= limit),
        key=lambda m: (m.size_bytes, m.name),
    )
    for candidate in candidates:
        try:
            if gguf_difference(target.path, candidate.path) is None:
                return candidate
        except (EdgespecError, OSError):
            continue  # changed since it was examined: not a draft today
    return None


# -- where the programs keep their models ------------------------------------------------


def app_folders() -> list[Folder]:
    """The folders LM Studio, Ollama, Jan, the Hugging Face hub and llama.cpp keep models
    in, Linux's and macOS's both (a folder that is not there holds nothing)."""
    home, env = Path.home(), os.environ
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    data = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else home / ".local" / "share"
    ollama = Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"
    llama = (
        [Path(env["LLAMA_CACHE"])]
        if env.get("LLAMA_CACHE")
        else [cache / "llama.cpp", home / "Library" / "Caches" / "llama.cpp"]
    )
    return [
        Folder("LM Studio", home / ".lmstudio" / "models"),
        Folder("LM Studio", cache / "lm-studio" / "models"),
        Folder("Ollama", ollama, "ollama"),
        Folder("Jan", home / "jan" / "models"),
        Folder("Jan", data / "Jan" / "data" / "llamacpp" / "models"),
        Folder("Jan", home / "Library" / "Application Support" / "Jan" / "data" / "llamacpp" / "models"),
        Folder("Hugging Face", _hub_cache(env, cache), "hub"),
        *(Folder("llama.cpp", path) for path in llama),
    ]


def _hub_cache(env: Mapping[str, str], cache: Path) -> Path:
    """Where huggingface_hub keeps its downloads, by the same variables it reads."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(env[name])
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else cache / "huggingface"
    return hf_home / "hub"


def _where(folder: Path) -> str:
    """A person's folder as the list says it: under the home folder as ``~/…``."""
    try:
        return "~/" + folder.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(folder)


def _scan(folder: Folder) -> list[LocalModel]:
    root = folder.root.expanduser().absolute()
    if not root.is_dir():
        return []
    scan = {"files": _file_models, "hub": _hub_models, "ollama": _ollama_models}[folder.kind]
    try:
        return scan(Folder(folder.where, root, folder.kind))
    except OSError:
        return []  # a folder that cannot be listed holds nothing this program can use


# -- plain folders: every GGUF under them --------------------------------------------------


def _walk(root: Path, suffix: str | None) -> list[Path]:
    """Every file under ``root`` (of ``suffix``, when given), links to folders followed
    with each real folder entered once, to ``MAX_DEPTH``; sorted. A dangling link is
    listed: it is a file that was there."""
    found: list[Path] = []
    entered: set[tuple[int, int]] = set()
    for top, dirs, files in os.walk(root, followlinks=True):
        here = Path(top)
        try:
            st = here.stat()
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in entered:
            dirs[:] = []  # reached again through a link: its files are listed already
            continue
        entered.add((st.st_dev, st.st_ino))
        if len(here.relative_to(root).parts) >= MAX_DEPTH:
            dirs[:] = []
        found += [here / name for name in files if suffix is None or name.lower().endswith(suffix)]
    return sorted(found)


def _first_parts(paths: Iterable[Path]) -> list[Path]:
    """One path per model: a split model's first part (named even when it is missing,
    so the model is listed as broken), every other model file as it is."""
    firsts: dict[Path, None] = {}
    for path in paths:
        if hubref.is_model_file(path.name):  # projectors and imatrix files by their names
            firsts[path.with_name(hubref.split_parts(path.name)[0])] = None
    return list(firsts)


def _file_models(folder: Folder) -> list[LocalModel]:
    found = []
    for first in _first_parts(_walk(folder.root, ".gguf")):
        stem = hubref.model_stem(first.name)
        # Jan's newer folders hold "<model id>/model.gguf": the folder names the model.
        name = first.parent.name if stem.lower() == "model" and first.parent != folder.root else stem
        if (model := _examine(first, name, folder.where)) is not None:
            found.append(model)
    return found


def _hub_models(folder: Folder) -> list[LocalModel]:
    """``models--owner--repo/snapshots/<revision>/**/*.gguf``, named owner/repo/stem."""
    found = []
    for repo_dir in sorted(folder.root.glob("models--*--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        snapshots = repo_dir / "snapshots"
        for snapshot in sorted(snapshots.iterdir()) if snapshots.is_dir() else ():
            for first in _first_parts(_walk(snapshot, ".gguf")):
                inside = first.relative_to(snapshot)
                name = "/".join([repo, *inside.parent.parts, hubref.model_stem(inside.name)])
                if (model := _examine(first, name, folder.where)) is not None:
                    found.append(model)
    return found


# -- Ollama: manifests naming content-addressed blobs ----------------------------------------


def _ollama_models(folder: Folder) -> list[LocalModel]:
    """Every manifest under ``manifests/<registry>/<namespace>/<model>/<tag>`` whose
    model layer names a blob, listed by the name a person pulls it by."""
    manifests = folder.root / "manifests"
    found = []
    for manifest in _walk(manifests, None) if manifests.is_dir() else []:
        name = _ollama_name(manifest.relative_to(manifests))
        if name is None:
            continue
        blob, problem = _ollama_blob(folder.root, manifest)
        if problem is not None:
            found.append(LocalModel(manifest, name, folder.where, 0, real_path(manifest), problem))
        elif blob is not None and (model := _examine(blob, name, folder.where)) is not None:
            found.append(model)
    return found


def _ollama_name(relative: Path) -> str | None:
    """registry.ollama.ai/library/llama3.2/3b → "llama3.2:3b"; another namespace or
    registry stays in the name (``someone/model:tag``, ``hf.co/owner/repo:tag``)."""
    parts = list(relative.parts)
    if len(parts) < 3:
        return None  # not a manifest of Ollama's layout
    if parts[0] == OLLAMA_REGISTRY:
        parts = parts[1:]
        if len(parts) == 3 and parts[0] == OLLAMA_NAMESPACE:
            parts = parts[1:]
    return "/".join(parts[:-1]) + ":" + parts[-1]


def _ollama_blob(root: Path, manifest: Path) -> tuple[Path | None, str | None]:
    """(the model layer's blob, None), (None, why it cannot be used), or (None, None)
    for a manifest with no model layer (not a language model: nothing to list)."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
    except (OSError, ValueError, AttributeError):
        return None, "its Ollama manifest cannot be read as JSON"
    digests = [
        layer.get("digest")
        for layer in layers
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER
    ]
    if not digests:
        return None, None
    digest = str(digests[0])
    # Blobs are "sha256-<hex>"; Ollama releases before 0.1.35 named them "sha256:<hex>".
    for blob in (root / "blobs" / digest.replace(":", "-", 1), root / "blobs" / digest):
        if blob.exists():
            return blob, None
    return None, f"its weights (blob {digest[:19]}…) are missing from {root / 'blobs'}"


# -- one model examined ------------------------------------------------------------------


def _examine(first: Path, name: str, where: str) -> LocalModel | None:
    """The model whose (first) file is ``first``, with its problem if it has one; None
    for a vision projector, which is no model to run."""
    parts = [first.with_name(part) for part in hubref.split_parts(first.name)]
    missing = [part for part in parts if not part.exists()]
    size = _size(parts)
    problem = None
    if missing and len(parts) == 1:
        problem = _gone(first)
    elif missing:
        problem = f"part {parts.index(missing[0]) + 1} of {len(parts)} is missing ({missing[0].name})"
    else:
        problem, arch = _header(first)
        if arch in PROJECTOR_ARCHS:
            return None
    return LocalModel(first, name, where, size, real_path(first), problem)


def _header(path: Path) -> tuple[str | None, str]:
    """(why the header rules the file out or None, its architecture)."""
    try:
        info = read_info(path)
    except EdgespecError as exc:
        # read_info names the file; the list names it already.
        return str(exc).replace(str(path), "").strip(" :"), ""
    except (OSError, ValueError, struct.error, OverflowError, MemoryError) as exc:
        return f"cannot read its header ({type(exc).__name__}: {exc})", ""
    return None, str(info.metadata.get("general.architecture", ""))


def _gone(path: Path) -> str:
    if path.is_symlink():
        try:
            return f"the file is gone: it links to {os.readlink(path)}, which is not there"
        except OSError:
            pass
    return "the file is gone"


def _size(parts: list[Path]) -> int:
    total = 0
    for part in parts:
        try:
            total += part.stat().st_size
        except OSError:
            continue  # missing parts are the problem reported, not a size
    return total


def real_path(path: Path) -> Path:
    """The real file behind ``path`` (links resolved), which two folders may share."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a loop of links
        return path.absolute()


__all__ = [
    "Folder",
    "LocalFolders",
    "LocalModel",
    "app_folders",
    "find_local_models",
    "local_draft",
    "real_path",
]
