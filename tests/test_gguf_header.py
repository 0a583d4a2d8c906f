"""A GGUF header is parsed once per process, and a large file's parse is kept on disk
(``edgespec.models.kept``); either is reused only for the same file unchanged: a file
truncated or rewritten in place after it was read is read again, and gets its one-line
error."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
from edgespec.models import gguf, kept, vocab
from edgespec.models.gguf import read_info


def test_a_header_read_again_is_the_same_parse(smol_path: Path, tmp_path: Path):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smol_path, copy)
    assert read_info(copy) is read_info(copy)
    assert read_info(copy).metadata == read_info(smol_path).metadata


def test_a_file_changed_after_it_was_read_is_read_again(smol_path: Path, tmp_path: Path):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smol_path, copy)
    assert read_info(copy).data_end > 0
    size = copy.stat().st_size
    os.truncate(copy, size // 2)
    with pytest.raises(EdgespecError, match="truncated GGUF file"):
        read_info(copy)
    shutil.copyfile(smol_path, copy)
    read_info(copy)
    # The kernel stamps a file's times from a clock that ticks every few milliseconds: a
    # rewrite in the same tick as the copy would leave the file's identity unchanged.
    stamped = copy.stat().st_mtime_ns
    while time.time_ns() <= stamped + 20_000_000:
        time.sleep(0.005)
    with copy.open("r+b") as fh:  # same size, new content
        fh.write(b"XXXX")
    assert copy.stat().st_mtime_ns != stamped
    with pytest.raises(EdgespecError, match="wrong magic bytes"):
        read_info(copy)


@pytest.fixture
def facts_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``EDGESPEC_HOME`` and no header parsed yet in this process."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(gguf, "_parsed", {})
    return tmp_path / "home" / "facts"


def test_a_large_header_is_kept_on_disk_and_read_back_unparsed(
    smol_path: Path, tmp_path, facts_home, monkeypatch
):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smol_path, copy)
    first = read_info(copy)
    assert len(list(facts_home.glob("*.json"))) == 1
    monkeypatch.setattr(gguf, "_parsed", {})  # a new process
    parses = []
    real_parse = gguf._parse
    monkeypatch.setattr(gguf, "_parse", lambda *a: parses.append(a) or real_parse(*a))
    again = read_info(copy)
    assert again == first and not parses  # read from its file, not parsed
    with copy.open("r+b") as fh:  # same size, another header: the kept parse is not used
        fh.seek(8)
        fh.write((1).to_bytes(8, "little"))  # one tensor instead of all of them
    monkeypatch.setattr(gguf, "_parsed", {})
    assert read_info(copy).data_end < first.data_end and len(parses) == 1


def test_a_damaged_kept_fact_is_computed_again(facts_home):
    files = [["/models/a.gguf", 1 << 30, 1, 2]]
    assert kept.kept("test", files, lambda: {"n": 1}) == {"n": 1}
    (fact,) = facts_home.glob("*.json")
    fact.write_text("{not json")
    assert kept.kept("test", files, lambda: {"n": 2}) == {"n": 2}
    assert kept.kept("test", files, lambda: {"n": 3}) == {"n": 2}  # kept again, whole


def test_small_files_keep_nothing_and_old_facts_go(facts_home, monkeypatch):
    assert kept.kept("test", [["/small.gguf", 1000, 1, 2]], lambda: 1) == 1
    assert not facts_home.exists()
    monkeypatch.setattr(kept, "MOST_KEPT", 3)
    for i in range(5):
        kept.kept("test", [[f"/models/{i}.gguf", 1 << 30, i, i]], lambda i=i: i)
    assert len(list(facts_home.glob("*.json"))) == 3


def test_a_pairs_token_texts_are_compared_once(target_path: Path, draft_path: Path, facts_home, monkeypatch):
    compared = []
    real = vocab.table_difference
    monkeypatch.setattr(vocab, "table_difference", lambda *a: compared.append(a) or real(*a))
    assert vocab.gguf_difference(target_path, draft_path) is None
    assert vocab.gguf_difference(target_path, draft_path) is None
    assert len(compared) == 1 and len(list(facts_home.glob("*.json"))) == 3  # two headers, one verdict
