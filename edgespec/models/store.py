"""The model cache under ``EDGESPEC_HOME``: where verified files live and how they get there.

Layout::

    $EDGESPEC_HOME/models/NAME.gguf        a verified catalog model
    $EDGESPEC_HOME/models/NAME-00001-of-0000N.gguf …   the parts of a split one
    $EDGESPEC_HOME/models/*.gguf.json      each file's stamp: sha256, source, size, mtime
    $EDGESPEC_HOME/hub/OWNER/REPO/FILE     a verified file named by a hub reference
    $EDGESPEC_HOME/tmp/                    work in progress (same filesystem, so the
                                           final rename is atomic); tmp/hub/ is the
                                           hub client's working folder

A file reaches its final name only by ``install``, after its checksum matched, so an
interrupted pull never leaves something that looks complete. The stamp lets later uses
skip re-hashing a gigabyte while the file's size and mtime are unchanged; ``verify``
always re-hashes.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.host import home
from edgespec.models.catalog import CatalogModel
from edgespec.models.hubref import HubRef, part_name, select, split_info, split_parts

_HASH_BLOCK = 4 << 20


def models_dir() -> Path:
    return home() / "models"


def scratch_dir() -> Path:
    """A fresh private directory for work in progress, on the cache's filesystem."""
    base = home() / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="pull-", dir=base))


def model_file(name: str) -> Path:
    """The file llama.cpp opens for catalog model ``name``: NAME.gguf, or the first part
    of a cached split copy."""
    single = models_dir() / f"{name}.gguf"
    if single.exists():
        return single
    parts = sorted(models_dir().glob(f"{glob.escape(name)}-00001-of-[0-9][0-9][0-9][0-9][0-9].gguf"))
    return parts[0] if parts else single


def model_files(model: CatalogModel) -> list[Path]:
    """Every file of the cached copy of ``model`` (several for a split hub copy)."""
    first = model_file(model.name)
    if split_info(first.name) is None:
        return [first]
    return [first.with_name(Path(p).name) for p in split_parts(first.name)]


def catalog_part_file(model: CatalogModel, hub_file: str) -> Path:
    """Where part ``hub_file`` of a split hub source of ``model`` is cached: named so that
    llama.cpp finds the parts beside the first."""
    info = split_info(hub_file)
    if info is None:
        return models_dir() / f"{model.name}.gguf"
    _, number, count = info
    return models_dir() / part_name(model.name, number, count)


def hub_dir() -> Path:
    return home() / "hub"


def hub_file(repo: str, path: str) -> Path:
    """Where file ``path`` of hub repository ``repo`` is cached once verified."""
    return hub_dir().joinpath(*repo.split("/"), *path.split("/"))


def hub_download_dir(repo: str) -> Path:
    """The hub client's working folder for ``repo`` (its partial files, metadata and
    locks), on the cache's filesystem so a finished file moves into place by a rename."""
    return home().joinpath("tmp", "hub", *repo.split("/"))


def _stamp_file(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
            if on_bytes:
                on_bytes(len(block))
    return digest.hexdigest()


@dataclass(frozen=True)
class Stamp:
    sha256: str
    source: str
    size: int
    mtime_ns: int

    def matches(self, path: Path) -> bool:
        st = path.stat()
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns


def read_stamp(path: Path) -> Stamp | None:
    try:
        return Stamp(**json.loads(_stamp_file(path).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_stamp(path: Path, sha256: str, source: str) -> None:
    st = path.stat()
    stamp = Stamp(sha256=sha256, source=source, size=st.st_size, mtime_ns=st.st_mtime_ns)
    tmp = _stamp_file(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(stamp.__dict__, indent=1) + "\n")
    os.replace(tmp, _stamp_file(path))


def publish(tmp: Path, final: Path) -> None:
    """Give a finished file its final name for good: its data reaches the disk before the
    rename (else a crash could leave the final name on a file of zeros), and the rename
    before this returns. It also means no gigabytes are still being written back when the
    caller goes on to time something (the F16 stand-in is measured right after it is made)."""
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def trusted_checksums(model: CatalogModel, stamp: Stamp | None) -> set[str]:
    """Checksums a cached copy of ``model`` may have: the catalog's, plus a hub LFS
    checksum recorded at download time for a hub source the catalog has no sum for."""
    sums = model.known_checksums()
    if stamp and stamp.source == "hub" and model.hub and not model.hub.sha256:
        sums.add(stamp.sha256)
    return sums


def stamped(path: Path) -> Stamp | None:
    """The stamp of ``path`` when the file is there and unchanged since it was stamped."""
    if not path.is_file():
        return None
    stamp = read_stamp(path)
    return stamp if stamp and stamp.matches(path) else None


def cached(model: CatalogModel) -> Path | None:
    """The cached file of ``model`` (the first part of a split copy) if it is there and
    known good, else None.

    Trusts an unchanged stamp; re-hashes (and re-stamps) a file that lost its stamp."""
    files = model_files(model)
    if len(files) > 1:
        # The parts of a hub copy carry the hub's LFS checksums, checked at download.
        ok = all((st := stamped(p)) and st.source == "hub" for p in files)
        return files[0] if ok and model.hub and not model.hub.sha256 else None
    path = files[0]
    if not path.is_file():
        return None
    stamp = read_stamp(path)
    if stamp and stamp.matches(path):
        return path if stamp.sha256 in trusted_checksums(model, stamp) else None
    sha = sha256_file(path)
    if sha in model.known_checksums():
        write_stamp(path, sha, "registry" if model.registry and sha == model.registry.sha256 else "hub")
        return path
    return None


def verify(model: CatalogModel, on_bytes: Callable[[int], None] | None = None) -> str:
    """Re-hash the cached copy. Returns "ok", "missing" or a one-line problem."""
    files = model_files(model)
    if len(files) > 1:
        return _verify_parts(files, on_bytes)
    path = files[0]
    if not path.is_file():
        return "missing"
    stamp = read_stamp(path)
    sha = sha256_file(path, on_bytes)
    if sha in trusted_checksums(model, stamp):
        if not (stamp and stamp.matches(path) and stamp.sha256 == sha):
            write_stamp(path, sha, stamp.source if stamp else "registry")
        return "ok"
    return f"checksum mismatch (got {sha[:12]}…, size {path.stat().st_size:,} bytes)"


def _verify_parts(files: list[Path], on_bytes: Callable[[int], None] | None) -> str:
    for path in files:
        if not path.is_file():
            return f"part {path.name} is missing"
        stamp = read_stamp(path)
        sha = sha256_file(path, on_bytes)
        if not stamp or stamp.sha256 != sha:
            return f"checksum mismatch in {path.name} (got {sha[:12]}…)"
        if not stamp.matches(path):
            write_stamp(path, sha, stamp.source)
    return "ok"


def verify_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """Re-hash one stamped file (a hub reference's) against its stamp."""
    if not path.is_file():
        return "missing"
    stamp = read_stamp(path)
    sha = sha256_file(path, on_bytes)
    if stamp is None:
        return "no checksum recorded"
    if stamp.sha256 != sha:
        return f"checksum mismatch (got {sha[:12]}…, expected {stamp.sha256[:12]}…)"
    if not stamp.matches(path):
        write_stamp(path, sha, stamp.source)
    return "ok"


def install(tmp_file: Path, model: CatalogModel, sha256: str, source: str) -> Path:
    """Move a verified file of ``model`` to its final name (NAME.gguf)."""
    return install_file(tmp_file, models_dir() / f"{model.name}.gguf", sha256, source)


def install_file(tmp_file: Path, final: Path, sha256: str, source: str) -> Path:
    """Move a verified file to its final name; the stamp goes first so that the final
    name never appears without one."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        final.unlink()
    write_stamp(tmp_file, sha256, source)
    os.replace(_stamp_file(tmp_file), _stamp_file(final))
    publish(tmp_file, final)
    # The rename keeps mtime, so the stamp written for the temporary name stays valid.
    return final


def require_space(where: Path, needed: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    if needed and free < needed:
        raise EdgespecError(
            f"not enough disk space in {where}: need {needed / 1e9:.2f} GB, {free / 1e9:.2f} GB free"
        )


def cached_hub_model(ref: HubRef) -> tuple[str, ...] | None:
    """The repository files of ``ref`` already verified in the cache, without asking the
    hub; None when any part is missing."""
    if ref.file:
        files = tuple(split_parts(ref.file))
    else:
        base = hub_file(ref.repo, "")
        if not base.is_dir():
            return None
        local = [p.relative_to(base).as_posix() for p in base.rglob("*.gguf") if stamped(p)]
        candidate, _ = select(ref, local)
        if candidate is None:
            return None
        files = tuple(split_parts(candidate.first))
    ok = all((stamp := stamped(hub_file(ref.repo, f))) and stamp.source == "hub" for f in files)
    return files if ok else None
