"""ggml's devices, through the backend registry of the libraries ``llama_cpp`` loaded.

llama-cpp-python binds llama.h only; the device registry (ggml-backend.h) lives in
libggml-base and libggml, which ``import llama_cpp`` has already loaded from its ``lib``
folder. They are opened here under the name the dynamic linker loaded them by
(``open_library``), so the handles here are the very ones llama.cpp uses. A device is a
``ggml_backend_dev_t`` (an address).

llama.cpp counts a build with the RPC backend as one that can offload to a GPU
(``llama_supports_gpu_offload`` is true as soon as the RPC registry exists), so whether
this machine has a GPU is asked of the devices themselves (``local_gpus``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llama_cpp

# enum ggml_backend_dev_type (ggml-backend.h)
CPU, GPU, IGPU, ACCEL, META = range(5)
RPC_REGISTRY = "RPC"


def library_dir() -> Path:
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def _names(stem: str) -> list[str]:
    """File names a ggml library has, the one the dynamic linker records (its soname) first."""
    if sys.platform == "win32":
        return [f"{stem}.dll", f"lib{stem}.dll"]
    if sys.platform == "darwin":
        return [f"lib{stem}.0.dylib", f"lib{stem}.dylib"]
    return [f"lib{stem}.so.0", f"lib{stem}.so"]


def open_library(stem: str) -> ctypes.CDLL | None:
    """The copy of ``lib<stem>`` that llama.cpp itself uses, or None where there is none.

    A wheel may hold each library as several files (``libggml-rpc.so`` and
    ``libggml-rpc.so.0`` copies, not links), and opening another file by its path loads a
    second copy with state of its own (its own registry, its own abort callback): so the
    one already loaded under its soname is asked for first, and a file opened only when
    none is loaded."""
    for name in _names(stem):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
    for name in _names(stem):
        if (library_dir() / name).is_file():
            return ctypes.CDLL(str(library_dir() / name), mode=ctypes.RTLD_GLOBAL)
    return None


def _declare(lib: ctypes.CDLL, name: str, restype, *argtypes) -> None:
    function = getattr(lib, name)
    function.restype, function.argtypes = restype, list(argtypes)


@cache
def ggml() -> _Both:
    """One object with ggml-backend's registry functions, from libggml-base (a registry's
    and a device's own calls) and libggml (the global registry), declared once."""
    base, main = open_library("ggml-base"), open_library("ggml")
    if base is None or main is None:
        raise OSError(f"ggml's libraries are not in {library_dir()}")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    _declare(base, "ggml_backend_reg_name", ctypes.c_char_p, vp)
    _declare(base, "ggml_backend_reg_dev_count", sz, vp)
    _declare(base, "ggml_backend_reg_dev_get", vp, vp, sz)
    _declare(base, "ggml_backend_dev_name", ctypes.c_char_p, vp)
    _declare(base, "ggml_backend_dev_description", ctypes.c_char_p, vp)
    _declare(base, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
    _declare(base, "ggml_backend_dev_type", ctypes.c_int, vp)
    _declare(base, "ggml_backend_dev_backend_reg", vp, vp)
    _declare(base, "ggml_backend_dev_buffer_type", vp, vp)
    _declare(main, "ggml_backend_dev_count", sz)
    _declare(main, "ggml_backend_dev_get", vp, sz)
    _declare(main, "ggml_backend_dev_by_type", vp, ctypes.c_int)
    _declare(main, "ggml_backend_reg_by_name", vp, ctypes.c_char_p)
    return _Both(base, main)


class _Both:
    """Attribute look-up over two libraries, the first that has the name."""

    def __init__(self, *libs: ctypes.CDLL):
        self._libs = libs

    def __getattr__(self, name: str):
        for lib in self._libs:
            try:
                return getattr(lib, name)
            except AttributeError:
                continue
        raise AttributeError(name)


@dataclass(frozen=True)
class Device:
    """One ggml device as this process sees it."""

    handle: int  # ggml_backend_dev_t
    name: str  # "CPU", "CUDA0", "RPC0" …
    description: str  # a remote device's is its worker's HOST:PORT
    kind: int  # CPU, GPU, IGPU, ACCEL
    registry: str  # the backend that owns it ("CPU", "CUDA", "RPC" …)

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes; a remote device's are asked of its worker, over the network."""
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml().ggml_backend_dev_memory(self.handle, ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


def device(handle: int) -> Device:
    lib = ggml()
    registry = lib.ggml_backend_dev_backend_reg(handle)
    return Device(
        handle=handle,
        name=(lib.ggml_backend_dev_name(handle) or b"").decode(errors="replace"),
        description=(lib.ggml_backend_dev_description(handle) or b"").decode(errors="replace"),
        kind=lib.ggml_backend_dev_type(handle),
        registry=(lib.ggml_backend_reg_name(registry) or b"").decode(errors="replace") if registry else "",
    )


def registered() -> list[Device]:
    """Every device in ggml's global registry (RPC workers are never added to it here)."""
    lib = ggml()
    return [device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def of_registry(registry: int) -> list[Device]:
    """The devices of one backend registry (an RPC worker's, from ``rpc_add_server``)."""
    lib = ggml()
    return [
        device(lib.ggml_backend_reg_dev_get(registry, i))
        for i in range(lib.ggml_backend_reg_dev_count(registry))
    ]


def local_gpus() -> list[Device]:
    """This machine's GPUs, as llama.cpp picks them by default: discrete ones, else the
    integrated ones of one backend; never an RPC worker's."""
    found = [d for d in registered() if d.registry != RPC_REGISTRY]
    gpus = [d for d in found if d.kind == GPU]
    if gpus:
        return gpus
    igpus = [d for d in found if d.kind == IGPU]
    return [d for d in igpus if d.registry == igpus[0].registry]


def cpu() -> Device:
    handle = ggml().ggml_backend_dev_by_type(CPU)
    if not handle:
        raise OSError("llama.cpp has no CPU device")
    return device(handle)


def has_gpu() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to (an RPC build alone is none)."""
    try:
        return bool(local_gpus())
    except (OSError, AttributeError):  # an unusual wheel: trust llama.cpp's own answer
        return bool(llama_cpp.llama_supports_gpu_offload())
