"""The Hugging Face hub: listing a repository and downloading verified files from it.

The hub client (``huggingface_hub``) does the transfers: it honours ``HF_ENDPOINT``,
``HF_TOKEN`` and ``HF_HUB_OFFLINE``, resumes a transfer cut mid-file with an HTTP range
request, and shows progress. What it downloads reaches edgespec's cache only after its
sha256 matched the hub's LFS sha256 (or the catalog's); a file that does not match is
deleted, so nothing unverified is left behind.

Every failure becomes one line naming the hub endpoint or the repository and file.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from edgespec.errors import EdgespecError
from edgespec.models import store
from edgespec.progress import byte_bar

DEFAULT_ENDPOINT = "https://huggingface.co"
_PROBE_SECONDS = 2.0
_NETWORK_ERRORS = {"ConnectError", "ConnectTimeout", "ConnectionError", "TimeoutException", "ReadTimeout"}
_NETWORK_ERRORS |= {"ReadError", "RemoteProtocolError", "OfflineModeIsEnabled", "LocalEntryNotFoundError"}


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def unavailable_reason() -> str | None:
    """Why the hub cannot be used right now, or None. Decided in about two seconds (the
    hub client itself retries a refused connection for half a minute)."""
    if offline():
        return "HF_HUB_OFFLINE is set"
    url = urlparse(endpoint())
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=_PROBE_SECONDS):
            return None
    except OSError as exc:
        return f"{host}:{port} is unreachable ({exc.strerror or exc.__class__.__name__})"


def unreachable(label: str, reason: str) -> EdgespecError:
    return EdgespecError(f"cannot reach the Hugging Face hub ({endpoint()}) for {label}: {reason}")


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str  # the LFS sha256; "" for a file stored without LFS


@dataclass(frozen=True)
class Listing:
    repo: str
    commit: str
    files: dict[str, HubFile]


def listing(repo: str, label: str) -> Listing:
    """The files of ``repo`` at its main revision, with their sizes and LFS checksums."""
    reason = unavailable_reason()
    if reason:
        raise unreachable(label, reason)
    try:
        from huggingface_hub import HfApi

        info = HfApi(endpoint=endpoint()).model_info(repo, revision="main", files_metadata=True)
    except ImportError:
        raise EdgespecError("huggingface-hub is not installed") from None
    except Exception as exc:  # the client raises many kinds; each becomes one line
        raise _one_line(exc, repo, "", label) from None
    files = {}
    for sibling in info.siblings or []:
        lfs = getattr(sibling, "lfs", None)
        size = (lfs.size if lfs else sibling.size) or 0
        files[sibling.rfilename] = HubFile(sibling.rfilename, int(size), lfs.sha256 if lfs else "")
    return Listing(repo=repo, commit=info.sha or "main", files=files)


def download(
    found: Listing,
    names: list[str],
    dests: list[Path],
    *,
    label: str,
    expected: str = "",
    quiet: bool = False,
    force: bool = False,
) -> list[Path]:
    """Download files ``names`` of a listed repository into ``dests`` (cache paths),
    each verified before it is installed; files already there with the expected checksum
    are kept unless ``force``. ``expected`` is the catalog's sha256 of a single file,
    which then wins over the hub's."""
    for name in names:
        if name not in found.files:
            raise EdgespecError(f"{found.repo} has no file {name}")
    todo = []
    for name, dest in zip(names, dests, strict=True):
        want = (expected if len(names) == 1 and expected else "") or found.files[name].sha256
        if not want:
            raise EdgespecError(f"the hub gives no sha256 for {found.repo}/{name}, so it cannot be verified")
        stamp = store.stamped(dest)
        if force or not (stamp and stamp.sha256 == want):
            todo.append((name, dest, want))
    store.require_space(store.home(), sum(found.files[n].size for n, _, _ in todo))
    for name, dest, want in todo:
        _download_one(found, name, dest, want, label, quiet)
    return dests


def _download_one(found: Listing, name: str, dest: Path, want: str, label: str, quiet: bool) -> None:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        raise EdgespecError("huggingface-hub is not installed") from None
    work = store.hub_download_dir(found.repo)
    if quiet:
        disable_progress_bars()
    try:
        got = Path(
            hf_hub_download(found.repo, name, revision=found.commit, local_dir=work, endpoint=endpoint())
        )
    except Exception as exc:  # one line per kind of failure, never a traceback
        raise _one_line(exc, found.repo, name, label) from None
    try:
        bar = byte_bar(f"verify {Path(name).name}", got.stat().st_size) if not quiet else None
        sha = store.sha256_file(got, bar.update if bar else None)
        if bar:
            bar.close()
        if sha != want:
            raise EdgespecError(
                f"checksum mismatch for {found.repo}/{name}: expected {want[:12]}…, got {sha[:12]}…; "
                "the download was deleted and nothing was installed"
            )
        store.install_file(got, dest, sha, "hub")
    finally:
        _forget(work, name, got)


def _forget(work: Path, name: str, got: Path) -> None:
    """Remove what the client kept of a finished (or refused) download."""
    got.unlink(missing_ok=True)
    meta = work / ".cache" / "huggingface" / "download"
    for suffix in (".metadata", ".lock"):
        with contextlib.suppress(OSError):
            (meta / f"{name}{suffix}").unlink()


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _one_line(exc: Exception, repo: str, name: str, label: str) -> EdgespecError:
    """The hub client's exception as one line a user can act on."""
    kinds = {base.__name__ for e in _chain(exc) for base in type(e).__mro__}
    what = f"{repo}/{name}" if name else repo
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if "GatedRepoError" in kinds:
        if os.environ.get("HF_TOKEN"):
            return EdgespecError(f"{repo} is gated and the token in HF_TOKEN has no access to it yet")
        return EdgespecError(f"{repo} is gated: accept its terms on the hub, then set HF_TOKEN to your token")
    if "RepositoryNotFoundError" in kinds:
        return EdgespecError(f"no Hugging Face repository {repo} (if it is private, set HF_TOKEN)")
    if "RevisionNotFoundError" in kinds:
        return EdgespecError(f"{repo} has no main revision")
    if kinds & {"EntryNotFoundError", "RemoteEntryNotFoundError"}:
        return EdgespecError(f"{repo} has no file {name}")
    if kinds & _NETWORK_ERRORS and not status:
        cause = next((e for e in _chain(exc) if type(e).__name__ not in {"LocalEntryNotFoundError"}), exc)
        detail = str(cause).splitlines()[0] if str(cause).strip() else type(cause).__name__
        return unreachable(label, detail)
    if status:
        return EdgespecError(f"the Hugging Face hub answered HTTP {status} for {what}")
    text = str(exc).strip().splitlines()
    return EdgespecError(f"download of {what} failed: {text[0] if text else type(exc).__name__}")
