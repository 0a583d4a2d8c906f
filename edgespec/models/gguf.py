"""A small GGUF reader: enough of the header to reject bad files with a clear message
before llama.cpp maps them, and to read a few metadata values.

GGUF layout: magic ``GGUF``, version, tensor count, metadata count, the metadata
key/values, the tensor infos (name, dims, type, offset), then, aligned, the tensor data.
A file whose tensor data would end past the end of the file is truncated.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models.kept import file_identity, kept

MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# ggml type id -> (elements per block, bytes per block), from ggml's type traits.
_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
    19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
    25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17),
}  # fmt: skip

# metadata value type id -> struct format of a scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass
class GGUFInfo:
    version: int
    # Arrays longer than 64 items (token lists, merges) are recorded by their length only.
    metadata: dict[str, object] = field(default_factory=dict)
    data_end: int = 0  # where the last tensor's data ends; 0 when a type size is unknown


def kv_bytes_per_token(info: GGUFInfo) -> int:
    """Bytes an f16 KV cache spends per token of context, from the header's shapes."""
    meta = info.metadata
    arch = meta.get("general.architecture", "")
    layers = int(meta.get(f"{arch}.block_count", 0))  # type: ignore[arg-type]
    heads = int(meta.get(f"{arch}.attention.head_count", 1)) or 1  # type: ignore[arg-type]
    heads_kv = int(meta.get(f"{arch}.attention.head_count_kv", heads))  # type: ignore[arg-type]
    embd = int(meta.get(f"{arch}.embedding_length", 0))  # type: ignore[arg-type]
    k_dim = int(meta.get(f"{arch}.attention.key_length", embd // heads))  # type: ignore[arg-type]
    v_dim = int(meta.get(f"{arch}.attention.value_length", embd // heads))  # type: ignore[arg-type]
    return layers * heads_kv * (k_dim + v_dim) * 2


class _Reader:
    """Sequential reads over a memory map: struct.unpack_from avoids a Python read call
    per string, which matters for tokenizer arrays of 150k entries."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos = buf, path, 0

    def skip(self, n: int) -> int:
        start, self.pos = self.pos, self.pos + n
        if self.pos > len(self.buf):
            raise EdgespecError(f"{self.path}: truncated GGUF file (header ends early)")
        return start

    def unpack(self, fmt: str):
        start = self.skip(struct.calcsize("<" + fmt))
        return struct.unpack_from("<" + fmt, self.buf, start)[0]

    def string(self) -> str:
        n = self.unpack("Q")
        start = self.skip(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int, offsets: list[int] | None = None) -> None:
        """Step over ``count`` strings (tokenizer arrays hold 150k or more), noting where
        each starts in ``offsets`` when given: one tight loop, no call per string."""
        buf, pos, end, length = self.buf, self.pos, len(self.buf), _U64.unpack_from
        for i in range(count):
            if offsets is not None:
                offsets[i] = pos
            if pos + 8 > end:
                raise EdgespecError(f"{self.path}: truncated GGUF file (header ends early)")
            pos += 8 + length(buf, pos)[0]
        if pos > end:
            raise EdgespecError(f"{self.path}: truncated GGUF file (header ends early)")
        self.pos = pos

    def value(self, vtype: int, keep: bool):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string() if keep else self.skip(self.unpack("Q"))
        if vtype == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            keep = keep and count <= 64
            if item_type in _SCALARS:
                fmt = "<" + _SCALARS[item_type] * count
                start = self.skip(struct.calcsize(fmt))
                return list(struct.unpack_from(fmt, self.buf, start)) if keep else count
            if item_type == _STRING and not keep:
                self.skip_strings(count)
                return count
            items = [self.value(item_type, keep) for _ in range(count)]
            return items if keep else count
        raise EdgespecError(f"{self.path}: not a valid GGUF file (unknown value type {vtype})")


def read_info(path: Path) -> GGUFInfo:
    """Parse the header; raise EdgespecError with one line for anything that is not a
    complete GGUF file."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        raise EdgespecError(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise EdgespecError(f"model path is a directory, not a GGUF file: {path}") from None
    except PermissionError:
        raise EdgespecError(f"model file is not readable (permission denied): {path}") from None
    except OSError as exc:
        raise EdgespecError(f"cannot read model file {path}: {exc.strerror}") from None
    with fh:
        st = os.fstat(fh.fileno())
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if identity in _parsed:
            return _parsed[identity]
        if st.st_size < 24 or fh.read(4) != MAGIC:
            raise EdgespecError(f"{path}: not a GGUF model file (wrong magic bytes)")

        def parse() -> dict:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return asdict(_parse(_Reader(buf, path), st.st_size, path))

        info = GGUFInfo(**kept("gguf-header", [file_identity(path, st)], parse))
    _parsed[identity] = info
    while len(_parsed) > KEPT_HEADERS:
        del _parsed[next(iter(_parsed))]
    return info


# Headers parsed in this process, by the file's identity (device, inode, size, times): a
# loading pair reads each header several times (resolving, pairing, loading). A large
# file's header is also kept on disk (``kept``): stepping over its 150k-entry token and
# merge lists in Python costs about 0.2 s a file. Read-only once made.
_parsed: dict[tuple[int, ...], GGUFInfo] = {}
KEPT_HEADERS = 32


def _parse(reader: _Reader, size: int, path: Path) -> GGUFInfo:
    reader.skip(4)
    info = GGUFInfo(version=reader.unpack("I"))
    if info.version not in (2, 3):
        raise EdgespecError(f"{path}: unsupported GGUF version {info.version}")
    n_tensors, n_kv = reader.unpack("Q"), reader.unpack("Q")
    for _ in range(n_kv):
        key = reader.string()
        value = reader.value(reader.unpack("I"), keep=True)
        info.metadata[key] = value
    data_ends = []
    for _ in range(n_tensors):
        reader.skip(reader.unpack("Q"))
        dims = [reader.unpack("Q") for _ in range(reader.unpack("I"))]
        ggml_type, offset = reader.unpack("I"), reader.unpack("Q")
        block = _TYPE_SIZES.get(ggml_type)
        data_ends.append(offset + math.prod(dims) // block[0] * block[1] if block else None)
    alignment = int(info.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = -(-reader.pos // alignment) * alignment
    if data_ends and None not in data_ends:
        info.data_end = data_start + max(data_ends)
        if info.data_end > size:
            raise EdgespecError(
                f"{path}: truncated GGUF file ({size:,} bytes, tensor data needs {info.data_end:,})"
            )
    elif data_start > size:
        raise EdgespecError(f"{path}: truncated GGUF file (ends inside the header)")
    return info


@dataclass(frozen=True)
class TokenTable:
    """A GGUF's token texts as stored: ``raw`` holds every (length, bytes) entry of
    ``tokenizer.ggml.tokens`` back to back and ``offsets[i]`` is where entry i starts
    (``offsets[-1]`` is the end). Two models give the same text for ids a..b exactly when
    ``raw[offsets[a]:offsets[b]]`` are equal, which compares 150k tokens in one step."""

    raw: bytes
    offsets: list[int]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def span(self, start: int, stop: int) -> bytes:
        return self.raw[self.offsets[start] : self.offsets[stop]]

    def text(self, token: int) -> str:
        return self.raw[self.offsets[token] + 8 : self.offsets[token + 1]].decode("utf-8", errors="replace")


def read_token_table(path: Path) -> TokenTable:
    """The token texts of a GGUF (empty when it has none); one line for a bad file."""
    read_info(path)  # the same one-line errors for a missing, foreign or truncated file
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        reader = _Reader(buf, path)
        reader.skip(8)
        reader.skip(16)  # tensor count, metadata count
        n_kv = struct.unpack_from("<Q", buf, 16)[0]
        for _ in range(n_kv):
            key = reader.string()
            vtype = reader.unpack("I")
            if key == "tokenizer.ggml.tokens" and vtype == _ARRAY:
                item_type, count = reader.unpack("I"), reader.unpack("Q")
                if item_type != _STRING:
                    break
                start = reader.pos
                offsets = [0] * (count + 1)
                reader.skip_strings(count, offsets)
                offsets[count] = reader.pos
                return TokenTable(raw=bytes(buf[start : reader.pos]), offsets=[o - start for o in offsets])
            reader.value(vtype, keep=False)
    return TokenTable(raw=b"", offsets=[0])
