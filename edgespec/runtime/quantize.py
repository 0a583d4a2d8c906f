"""Re-quantize a GGUF model with llama.cpp's own quantizer (``llama_model_quantize``).

The benchmark's F16 regime needs the default target in F16: on a CPU an F16 model is
bound by memory bandwidth, so a pass over several tokens costs about as much as one, the
shape of a GPU's cost curve. The derived file is kept in
``$EDGESPEC_HOME/models/derived/<stem>-f16-<key>.gguf``, where the key is taken from the
source's checksum (or its size and mtime when no verified stamp exists), so a changed
source gets a fresh conversion instead of a stale one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import llama_cpp

from edgespec.errors import EdgespecError
from edgespec.models import store
from edgespec.models.gguf import read_info
from edgespec.runtime.model import init_backend

# F16 weights take 16 bits each; the Q4_K_M sources hold about 5 bits a weight on average,
# so an F16 copy is a little over three times the source (3.2 GB for the 1.5B target).
_GROWTH = 3.3
FTYPES = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16}


def derived_dir() -> Path:
    return store.models_dir() / "derived"


def source_key(path: Path) -> str:
    """12 hex digits that change whenever the source file does. A verified stamp gives
    the sha256 without re-reading a gigabyte; otherwise size and mtime stand in for it."""
    stamp = store.read_stamp(path)
    if stamp is not None and stamp.matches(path):
        return stamp.sha256[:12]
    st = path.stat()
    return hashlib.sha256(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def derived_path(source: Path, ftype: str = "f16") -> Path:
    return derived_dir() / f"{source.stem}-{ftype}-{source_key(source)}.gguf"


def quantize(source: Path, ftype: str = "f16", *, quiet: bool = False) -> Path:
    """The cached ``ftype`` copy of ``source``, converted now if it is not there yet."""
    source = Path(source)
    if ftype not in FTYPES:
        raise EdgespecError(f"unknown quantization type {ftype!r} (known: {', '.join(FTYPES)})")
    read_info(source)  # one clear line for a missing or broken source before any work
    final = derived_path(source, ftype)
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    need = int(source.stat().st_size * _GROWTH)
    free = shutil.disk_usage(final.parent).free
    if free < need:
        raise EdgespecError(
            f"not enough disk space to convert {source.name} to {ftype.upper()}: needs about "
            f"{need / 1e9:.1f} GB in {final.parent}, {free / 1e9:.1f} GB free"
        )
    init_backend()  # routes llama.cpp's per-tensor log lines away from the terminal
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True  # the source is already quantized; F16 is a widening
    params.nthread = os.cpu_count() or 1
    # A temporary name in the same directory: an interrupted conversion never looks finished,
    # and the rename at the end is atomic.
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    if not quiet:
        print(f"edgespec: converting {source.name} to {ftype.upper()} (once, cached in {final.parent}) …",
              file=sys.stderr, flush=True)  # fmt: skip
    started = time.perf_counter()
    try:
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise EdgespecError(f"llama.cpp could not convert {source.name} to {ftype.upper()} (code {rc})")
        store.publish(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    if not quiet:
        print(f"edgespec: {final.name} ready ({final.stat().st_size / 1e9:.2f} GB, "
              f"{time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return final
