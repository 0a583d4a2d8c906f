"""One cached KV state on disk: a header saying what made it, the tokens it holds, and the
state bytes llama.cpp wrote (``llama_state_seq_get_data``).

A state is only as good as the model and context it came from, and llama.cpp would load
bytes of another model without complaint; so the header names the model's sha256, the
context settings and the llama.cpp version, and a CRC of the bytes catches a torn or
corrupted file before llama.cpp sees it. A file that fails any check is refused with the
reason (``StateFileError``), never loaded.

    magic (8 bytes) | header length (4, little-endian) | header (JSON)
    | tokens (int32 × n_tokens) | state bytes (payload_size)
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

MAGIC = b"ESKVST01"
SUFFIX = ".kvstate"
_LENGTH = struct.Struct("<I")
_MAX_HEADER = 1 << 16


class StateFileError(Exception):
    """A cache file that cannot be trusted; the message says why."""


@dataclass(frozen=True)
class Provenance:
    """What a state depends on: a state from another of these is not this model's."""

    model_sha256: str
    n_ctx: int
    llama_cpp: str
    kv_type: str = "f16"


@dataclass(frozen=True)
class Header:
    provenance: Provenance
    n_tokens: int
    payload_size: int
    payload_crc: int


def write(path: Path, provenance: Provenance, tokens: list[int], data: ctypes.Array) -> None:
    """Write the state to ``path`` whole or not at all (a temporary name, then a rename)."""
    payload = memoryview(data).cast("B")
    header = {
        "provenance": asdict(provenance),
        "n_tokens": len(tokens),
        "payload_size": len(payload),
        "payload_crc": zlib.crc32(payload),
    }
    encoded = json.dumps(header).encode()
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(MAGIC + _LENGTH.pack(len(encoded)) + encoded)
        fh.write(np.asarray(tokens, dtype="<i4").tobytes())
        fh.write(payload)
    os.replace(tmp, path)


def read_header(path: Path) -> tuple[Header, list[int]]:
    """The header and tokens of a state file (its bytes are read only by ``read_payload``)."""
    with path.open("rb") as fh:
        start = fh.read(len(MAGIC) + _LENGTH.size)
        if len(start) < len(MAGIC) + _LENGTH.size or not start.startswith(MAGIC):
            raise StateFileError("not an edgespec state file")
        (length,) = _LENGTH.unpack(start[len(MAGIC) :])
        if length > _MAX_HEADER:
            raise StateFileError("corrupt header")
        header = _parse_header(fh.read(length))
        raw = fh.read(4 * header.n_tokens)
    if len(raw) != 4 * header.n_tokens:
        raise StateFileError("truncated")
    tokens = np.frombuffer(raw, dtype="<i4").tolist()
    expected = len(MAGIC) + _LENGTH.size + length + len(raw) + header.payload_size
    if path.stat().st_size != expected:
        raise StateFileError("truncated or padded")
    return header, tokens


def _parse_header(raw: bytes) -> Header:
    try:
        fields = json.loads(raw)
        header = Header(
            provenance=Provenance(**fields["provenance"]),
            n_tokens=int(fields["n_tokens"]),
            payload_size=int(fields["payload_size"]),
            payload_crc=int(fields["payload_crc"]),
        )
    except (ValueError, TypeError, KeyError) as e:
        raise StateFileError(f"corrupt header ({type(e).__name__})") from None
    if header.n_tokens < 1 or header.payload_size < 1:
        raise StateFileError("corrupt header (empty state)")
    return header


def read_payload(path: Path, header: Header) -> ctypes.Array:
    """The state bytes, checked against the header's CRC. They are mapped from the file,
    privately, not copied: copying a state into fresh memory costs several times the
    check itself (docs/gpu.md). The file stays whole under the mapping because edgespec
    replaces a state file only by a rename and removes it only by an unlink (llama.cpp
    maps the model's file the same way)."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < header.payload_size:
            raise StateFileError("truncated")
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    data = (ctypes.c_uint8 * header.payload_size).from_buffer(mapped, size - header.payload_size)
    if zlib.crc32(memoryview(data).cast("B")) != header.payload_crc:
        raise StateFileError("its bytes do not match their checksum (corrupt)")
    return data
