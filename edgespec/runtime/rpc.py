"""A target split over machines: llama.cpp's RPC backend, from the library llama_cpp ships.

Another machine runs ``edgespec worker`` (or llama.cpp's ``rpc-server`` of the same
version), which serves its devices over TCP. Here ``--rpc HOST:PORT[,…]`` adds each worker
through ``ggml_backend_rpc_add_server`` (libggml-rpc, next to llama_cpp's other libraries),
whose registry lists the worker's devices, and the target is loaded over this machine and
those devices (``Placement``, applied to ``llama_model_params``):

* this machine keeps its share of the layers, the workers' devices the others, in
  proportion to free memory or to ``--tensor-split`` (this machine first, then each remote
  device in ``--rpc`` order): on a CPU here the first layers (those llama.cpp does not
  offload), on a GPU here the last ones (llama.cpp lists the workers' devices first);
* the output matrix stays here, so a verification pass sends a hidden state per token
  back over the network, not a row of logits per token (one float per vocabulary entry);
* the draft model is never given these devices: its passes must not pay the network.

ggml-rpc aborts the process when a worker cannot be reached or speaks another protocol
version, so each worker is checked first with a plain connection and the protocol's own
greeting (``check_worker``): a worker that is down, busy with another client (a worker
serves one at a time) or of another llama.cpp version is one line naming it. A worker lost
once the model is loaded: ``runtime/rpc_faults.py``.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass, field
from functools import cache

import llama_cpp

from edgespec.errors import EdgespecError
from edgespec.models.gguf import GGUFInfo
from edgespec.runtime import devices, rpc_faults

DEFAULT_PORT = 50052
# llama.cpp's RPC protocol (ggml-rpc.h of the vendored llama.cpp: RPC_PROTO_*_VERSION); a
# worker must have this major version and no newer minor one. tests/test_rpc.py checks it
# against the header whenever llama.cpp's sources are at hand.
PROTOCOL = (7, 0, 0)
_HELLO = 14  # RPC_CMD_HELLO, fixed across versions
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities, all zero for plain TCP
CONNECT_TIMEOUT_S = 3.0
GREETING_TIMEOUT_S = 5.0
# The tensor that turns the last hidden state into logits; tied embeddings (its copy of
# the token embeddings) are on this machine already, with the input layer.
_OUTPUT_HERE = rb"^output\.weight$"
HOW_TO_GET = (
    "this llama.cpp build has no RPC backend: run the set-up again (make setup), or build "
    'llama-cpp-python with CMAKE_ARGS="-DGGML_RPC=ON"'
)


# --- what the user asked for ------------------------------------------------------------


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT…]`` → the endpoints, checked (IPv4 addresses or host names:
    ggml-rpc speaks IPv4 only)."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    if not endpoints:
        raise EdgespecError("--rpc takes HOST:PORT[,HOST:PORT…], such as 192.168.1.20:50052")
    for endpoint in endpoints:
        check_endpoint(endpoint)
    if len(set(endpoints)) < len(endpoints):
        raise EdgespecError(f"--rpc names a worker twice: {text}")
    return endpoints


def check_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    bad = f"--rpc: {endpoint!r} is not HOST:PORT (an IPv4 address or host name, a port in 1..65535)"
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise EdgespecError(bad)
    if ":" in host or host.startswith("[") or any(c.isspace() for c in host):
        raise EdgespecError(bad)  # IPv6: ggml-rpc reads HOST as everything before the first ':'
    return host, int(port)


def parse_split(text: str) -> tuple[float, ...]:
    """``--tensor-split``: comma-separated proportions, this machine first."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not v >= 0 or v == float("inf") for v in values) or not sum(values) > 0:
        raise EdgespecError(
            f"--tensor-split takes proportions such as 1,3 (this machine first, then each worker's "
            f"device), none negative (got {text!r})"
        )
    return values


def layout_key(endpoints: tuple[str, ...], split: tuple[float, ...]) -> str:
    """The device layout in words, for a cost profile's key: the workers and the split
    (empty for a model on this machine alone)."""
    if not endpoints:
        return ""
    shares = ",".join(f"{v:g}" for v in split) if split else "by free memory"
    return f"rpc {','.join(endpoints)}; split {shares}"


# --- the library ---------------------------------------------------------------------------


@cache
def _library() -> ctypes.CDLL | str:
    """libggml-rpc with its two entry points declared, or the reason there is none."""
    try:
        lib = devices.open_library("ggml-rpc")
        if lib is None:
            return HOW_TO_GET
        add, start = lib.ggml_backend_rpc_add_server, lib.ggml_backend_rpc_start_server
    except (OSError, AttributeError) as exc:
        return f"{HOW_TO_GET} ({exc})"
    add.restype, add.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    start.restype = None
    start.argtypes = [
        ctypes.c_char_p,  # endpoint "HOST:PORT"
        ctypes.c_char_p,  # cache directory, or NULL
        ctypes.c_size_t,  # CPU threads
        ctypes.c_size_t,  # devices
        ctypes.POINTER(ctypes.c_void_p),  # ggml_backend_dev_t[devices]
    ]
    return lib


def available() -> bool:
    return not isinstance(_library(), str)


def unavailable_reason() -> str:
    """Why ``--rpc`` cannot work in this build, in one line ("" when it can)."""
    found = _library()
    return found if isinstance(found, str) else ""


def library() -> ctypes.CDLL:
    found = _library()
    if isinstance(found, str):
        raise EdgespecError(found)
    return found


# --- reaching a worker ---------------------------------------------------------------------


def check_worker(
    endpoint: str, timeout: float = CONNECT_TIMEOUT_S, *, fresh: bool = False
) -> tuple[int, int, int]:
    """Connect to a worker and greet it as ggml-rpc does; its protocol version, or one line
    naming what is wrong. ggml-rpc would abort the process on each of these. A worker this
    process is connected to already (a model on it still loaded) is not greeted again: it
    serves one client at a time, this one, and ggml-rpc shares that connection. ``fresh``:
    greet it all the same (that connection is known dead: the worker was lost)."""
    host, port = check_endpoint(endpoint)
    held = [] if fresh else rpc_faults.connections([(host, port)])
    for sock in held:
        sock.close()
    if held:
        return PROTOCOL
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise EdgespecError(
            f"worker {endpoint} did not answer within {timeout:g} s (is the address right?)"
        ) from None
    except OSError as exc:
        raise EdgespecError(
            f"cannot reach the worker {endpoint}: {exc.strerror or exc} "
            f"(start it there with: edgespec worker --host ADDRESS --port {port})"
        ) from None
    with sock:
        return _greet(sock, endpoint)


def _greet(sock: socket.socket, endpoint: str) -> tuple[int, int, int]:
    ours = ".".join(map(str, PROTOCOL))
    other = f"worker {endpoint} is no RPC worker of this llama.cpp version (protocol {ours})"
    sock.settimeout(GREETING_TIMEOUT_S)
    try:
        sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
        header = _read(sock, 8)
        size = struct.unpack("<Q", header)[0] if len(header) == 8 else -1
        reply = _read(sock, size) if size == 4 + _CAPS else b""
    except TimeoutError:
        raise EdgespecError(
            f"worker {endpoint} accepted the connection but did not answer within {GREETING_TIMEOUT_S:g} s: "
            "a worker serves one client at a time; is another edgespec using it?"
        ) from None
    except OSError as exc:
        raise EdgespecError(f"{other}: {exc.strerror or exc}") from None
    if len(reply) != 4 + _CAPS:
        raise EdgespecError(f"{other}: it closed the connection or answered the greeting otherwise")
    theirs = (reply[0], reply[1], reply[2])
    if theirs[0] != PROTOCOL[0] or theirs[1] > PROTOCOL[1]:
        raise EdgespecError(
            f"worker {endpoint} speaks RPC protocol {'.'.join(map(str, theirs))} and this edgespec's "
            f"llama.cpp speaks {ours}: run the same edgespec version on both machines"
        )
    return theirs


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


_add_lock = threading.Lock()


def remote_devices(endpoints: tuple[str, ...]) -> list[devices.Device]:
    """Every device of every worker, in ``endpoints`` order, each worker checked first."""
    lib = library()
    for endpoint in endpoints:
        check_worker(endpoint)
    found: list[devices.Device] = []
    with _add_lock:  # ggml-rpc keeps one registry per endpoint for the process
        for endpoint in endpoints:
            registry = lib.ggml_backend_rpc_add_server(endpoint.encode())
            if not registry:
                raise EdgespecError(f"worker {endpoint} offers no device")
            found.extend(devices.of_registry(registry))
    return found


# --- where the layers go -------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """Layers ``first``…``last`` on one device."""

    where: str  # "here" or the worker's HOST:PORT
    device: str  # ggml's name: CPU, Metal, RPC0 …
    first: int
    last: int


@dataclass(frozen=True)
class Plan:
    """Where a model's repeating layers go: what ``llama_model_params`` is given."""

    n_gpu_layers: int  # llama.cpp's count of layers (the output one included) on the devices
    device_shares: tuple[float, ...]  # tensor_split over the device list
    spans: tuple[Span, ...]


def plan(
    n_layer: int,
    shares: tuple[float, ...],
    remote: list[tuple[str, str]],
    local_gpus: list[str],
) -> Plan:
    """The layers of a model of ``n_layer`` repeating layers over this machine and the
    ``remote`` devices ((worker, device name), in order), by ``shares`` (this machine's,
    then each remote device's). Mirrors llama.cpp's assignment (``load_tensors``): the
    layers it does not offload stay on the CPU, the first ones; the rest go over the device
    list by the cumulative ``tensor_split``, the output layer counted after the last."""
    if len(shares) != 1 + len(remote):
        raise EdgespecError(
            f"--tensor-split takes {1 + len(remote)} proportions: this machine's, then one for each of "
            f"the workers' {len(remote)} device(s) ({', '.join(d for _, d in remote)}); got {len(shares)}"
        )
    total = sum(shares)
    if local_gpus:
        # Devices: the workers' first (llama.cpp's order), then this machine's GPUs, which
        # take the last layers and the output; no layer stays on the CPU.
        local = shares[0] / len(local_gpus)
        names = [*remote, *(("here", g) for g in local_gpus)]
        device_shares = (*shares[1:], *([local] * len(local_gpus)))
        n_gpu_layers, cpu_layers = n_layer + 1, 0
    else:
        cpu_layers = round(n_layer * shares[0] / total)
        names, device_shares = list(remote), shares[1:]
        n_gpu_layers = n_layer + 1 - cpu_layers
    on_devices = [d for d, (where, _) in zip(device_shares, names, strict=True) if where != "here"]
    if cpu_layers >= n_layer or not sum(on_devices) > 0:
        raise EdgespecError("--tensor-split leaves no layer on the workers: give them a share")
    spans = [Span("here", "CPU", 0, cpu_layers - 1)] if cpu_layers else []
    owner = _assign(n_layer, cpu_layers, n_gpu_layers, device_shares)
    for index, (where, name) in enumerate(names):
        layers = [il for il in range(cpu_layers, n_layer) if owner[il] == index]
        if layers:
            spans.append(Span(where, name, layers[0], layers[-1]))
    return Plan(n_gpu_layers, tuple(device_shares), tuple(spans))


def _assign(n_layer: int, start: int, n_gpu_layers: int, shares: tuple[float, ...]) -> dict[int, int]:
    """Device index of each offloaded layer, as llama.cpp's upper_bound over the splits."""
    cumulative, running, total = [], 0.0, sum(shares)
    for share in shares:
        running += share
        cumulative.append(running / total)
    active = min(n_gpu_layers, n_layer + 1)
    owner = {}
    for il in range(start, n_layer):
        position = (il - start) / active
        owner[il] = next((i for i, edge in enumerate(cumulative) if edge > position), len(shares) - 1)
    return owner


class _BuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override (llama.h)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class Placement:
    """A target's layers over this machine and its workers, and the C arrays that say so to
    llama.cpp, kept alive as long as the model (llama.cpp keeps the device list's
    contents; the arrays are ours)."""

    endpoints: tuple[str, ...]
    split: tuple[float, ...]  # as the user gave it; () for by free memory
    plan: Plan
    _arrays: list = field(default_factory=list, repr=False)

    def apply(self, mparams) -> None:
        """Fill ``llama_model_params``' devices, tensor_split, n_gpu_layers and overrides."""
        mparams.n_gpu_layers = self.plan.n_gpu_layers
        mparams.devices = ctypes.addressof(self._arrays[0])
        mparams.tensor_split = ctypes.cast(self._arrays[1], ctypes.POINTER(ctypes.c_float))
        mparams.tensor_buft_overrides = ctypes.addressof(self._arrays[2])

    def bound_stalls(self) -> None:
        """Once loaded: a worker that stops answering fails a pass, never hangs it."""
        rpc_faults.bound_stalls(check_endpoint(endpoint) for endpoint in self.endpoints)

    def describe(self) -> str:
        """``layers 0-13 here (CPU), 14-27 on 10.0.0.2:50052 (RPC0)``."""
        parts = [
            f"{s.first}-{s.last} {'here' if s.where == 'here' else 'on ' + s.where} ({s.device})"
            for s in self.plan.spans
        ]
        return "layers " + ", ".join(parts)

    def facts(self) -> dict:
        return {
            "workers": list(self.endpoints),
            "split": list(self.split) or "by free memory",
            "layers": [
                {"where": s.where, "device": s.device, "first": s.first, "last": s.last}
                for s in self.plan.spans
            ],
        }


def place(
    info: GGUFInfo, endpoints: tuple[str, ...], split: tuple[float, ...], *, use_gpu: bool
) -> Placement:
    """The placement of a model (its GGUF header ``info``) over this machine and the
    workers at ``endpoints``; each worker checked, one line for any that is not right."""
    remote = remote_devices(endpoints)
    rpc_faults.guard_aborts(endpoints)
    gpus = devices.local_gpus() if use_gpu else []
    arch = info.metadata.get("general.architecture", "")
    n_layer = int(info.metadata.get(f"{arch}.block_count", 0) or 0)  # type: ignore[arg-type]
    if n_layer < 2:
        raise EdgespecError("this model has too few layers to split over machines")
    if split:
        shares = split
    else:  # llama.cpp's default: by the free memory of each side
        here = sum(g.memory()[0] for g in gpus) if gpus else devices.cpu().memory()[0]
        # (a device that reports no memory counts as this machine's, as llama.cpp counts it)
        shares = (float(here), *(float(d.memory()[0] or here) for d in remote))
    layout = plan(n_layer, shares, [(d.description, d.name) for d in remote], [g.name for g in gpus])
    chosen = [*remote, *gpus]
    if len(chosen) > llama_cpp.llama_max_devices():
        raise EdgespecError(f"llama.cpp splits a model over {llama_cpp.llama_max_devices()} devices at most")
    device_list = (ctypes.c_void_p * (len(chosen) + 1))(*(d.handle for d in chosen), None)
    tensor_split = (ctypes.c_float * llama_cpp.llama_max_devices())(*layout.device_shares)
    overrides = (_BuftOverride * 2)()
    if not gpus:  # the output matrix on the CPU, with the input layer
        overrides[0] = _BuftOverride(
            _OUTPUT_HERE, devices.ggml().ggml_backend_dev_buffer_type(devices.cpu().handle)
        )
    return Placement(endpoints, split, layout, [device_list, tensor_split, overrides])


# --- serving this machine's devices ----------------------------------------------------------


def served_devices() -> list[devices.Device]:
    """What a worker serves, as llama.cpp's rpc-server picks by default: this machine's
    GPUs (and other non-CPU devices), else its CPU."""
    found = [d for d in devices.registered() if d.registry != devices.RPC_REGISTRY]
    accelerators = [d for d in found if d.kind not in (devices.CPU, devices.ACCEL)]
    return accelerators or [devices.cpu()]


def serve(endpoint: str, cache_dir: str | None, threads: int, served: list[devices.Device]) -> None:
    """llama.cpp's RPC server on ``endpoint`` (IPv4 ``HOST:PORT``): blocks while it serves,
    one client at a time; returns only when it could not listen or accept."""
    lib = library()
    handles = (ctypes.c_void_p * len(served))(*(d.handle for d in served))
    directory = cache_dir.encode() if cache_dir else None
    lib.ggml_backend_rpc_start_server(endpoint.encode(), directory, threads, len(served), handles)
