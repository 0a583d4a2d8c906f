"""A GGUF header is parsed once per process and the parse is reused only for the same
file unchanged: a file truncated or rewritten in place after it was read is read again,
and gets its one-line error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
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
    with copy.open("r+b") as fh:  # same size, new content
        fh.write(b"XXXX")
    with pytest.raises(EdgespecError, match="wrong magic bytes"):
        read_info(copy)
