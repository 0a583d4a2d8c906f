"""Decode rates measured here (``models/measured.py``): the median of a model file's last
answers, short answers left out, keyed by the file's identity, written atomically, and a
garbled or unwritable file never breaks an answer. Model-free: the "models" are small files."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from edgespec.models import measured
from edgespec.models.measured import KEPT_ANSWERS, MIN_TOKENS, measured_rate, rates_file, record_rate


@pytest.fixture()
def model(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


def test_nothing_measured_is_none(model):
    assert measured_rate(model) is None
    assert measured_rate(model.with_name("missing.gguf")) is None
    assert not rates_file().exists()


def test_the_median_of_the_last_answers(model):
    for rate in (10.0, 30.0, 31.0):
        record_rate(model, rate, 100)
    assert measured_rate(model) == 30.0
    # Only the last KEPT_ANSWERS count: a slow start is forgotten.
    for _ in range(KEPT_ANSWERS):
        record_rate(model, 28.0, 100)
    assert measured_rate(model) == 28.0
    assert len(json.loads(rates_file().read_text())["files"][next(iter(_files()))]["rates"]) == KEPT_ANSWERS


def _files() -> dict:
    return json.loads(rates_file().read_text())["files"]


def test_short_and_senseless_answers_are_ignored(model):
    record_rate(model, 30.0, MIN_TOKENS)
    for rate, tokens in ((500.0, MIN_TOKENS - 1), (float("nan"), 100), (float("inf"), 100), (0.0, 100)):
        record_rate(model, rate, tokens)
    record_rate(model, -3.0, 100)
    assert measured_rate(model) == 30.0


def test_a_changed_file_starts_afresh_and_another_file_is_apart(model, tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\1" * 60)
    record_rate(model, 30.0, 64)
    record_rate(other, 7.0, 64)
    assert (measured_rate(model), measured_rate(other)) == (30.0, 7.0)
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # replaced by a new pull
    assert measured_rate(model) is None
    assert measured_rate(other) == 7.0


def test_a_garbled_file_is_started_over(model):
    rates_file().parent.mkdir(parents=True, exist_ok=True)
    for garbage in ("{not json", "[]", json.dumps({"format": 1, "files": {"x": {"rates": ["fast"]}}}), ""):
        rates_file().write_text(garbage)
        assert measured_rate(model) is None
        record_rate(model, 12.0, 50)
        assert measured_rate(model) == 12.0
        rates_file().write_text(garbage)


def test_an_unwritable_home_never_raises(model, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EDGESPEC_HOME", str(blocker / "home"))
    record_rate(model, 30.0, 64)
    assert measured_rate(model) is None


def test_writes_are_whole_under_threads(model):
    """Eight threads record at once: the file is always one valid JSON document and no
    temporary file is left beside it."""

    def record(n: int) -> None:
        for i in range(20):
            record_rate(model, 20.0 + n + i / 100, 64)

    workers = [threading.Thread(target=record, args=(n,)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    rates = _files()[next(iter(_files()))]["rates"]
    assert len(rates) == KEPT_ANSWERS and measured_rate(model) is not None
    assert [p.name for p in rates_file().parent.iterdir()] == [rates_file().name]


def test_old_files_are_dropped(model, tmp_path, monkeypatch):
    monkeypatch.setattr(measured, "MOST_FILES", 3)
    paths = []
    for n in range(5):
        path = tmp_path / f"f{n}.gguf"
        path.write_bytes(b"GGUF" + bytes([n]) * 8)
        record_rate(path, 10.0 + n, 32)
        paths.append(path)
    assert [measured_rate(p) for p in paths] == [None, None, 12.0, 13.0, 14.0]
