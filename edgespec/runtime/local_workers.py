"""The workers of a split target that run on this machine (``--rpc 127.0.0.1:PORT``).

Such a worker computes its share of every pass of this process's target: while costs are
measured (``decoding/costs/measure.py``), its CPU time is this process's own work, not
another program's load (counted as load, it would mark every profile of a split target
measured on a busy machine, to be measured again at each start). A worker is found by the
socket it listens on: ``/proc/net/tcp`` gives the socket of the port, and the process
holding that socket is the worker (or a relay before it, such as the split benchmark's
network emulator, which is followed on to the worker's port). Linux only; elsewhere none
is found, and a worker on this machine counts as load.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_LISTEN, _ESTABLISHED = "0A", "01"  # the state column of /proc/net/tcp
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_HOPS = 4  # relays followed from an endpoint to the worker behind them, at most


@dataclass(frozen=True)
class _Socket:
    inode: str
    state: str
    port: int  # this end's
    peer: tuple[str, int]  # the other end's address and port


def _address(text: str) -> tuple[str, int]:
    """``/proc/net/tcp``'s ``0100007F:C3A4`` (32-bit words in the host's byte order) →
    ``("127.0.0.1", 50084)``."""
    hex_ip, hex_port = text.rsplit(":", 1)
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i : i + 4][:: -1 if sys.byteorder == "little" else 1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(hex_port, 16)


def _sockets(tables: Iterable[str] = _TABLES) -> list[_Socket]:
    found = []
    for table in tables:
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                with contextlib.suppress(IndexError, ValueError):
                    local, peer = _address(fields[1]), _address(fields[2])
                    found.append(_Socket(fields[9], fields[3], local[1], peer))
    return found


def _on_loopback(host: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    return False


def _holders(inodes: set[str]) -> dict[int, set[str]]:
    """The processes (this one excepted) holding any of the socket ``inodes``: pid → those
    it holds."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    found: dict[int, set[str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or another user's
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    inode = wanted.get(os.readlink(fd))
                    if inode is not None:
                        found.setdefault(int(proc.name), set()).add(inode)
    return found


def pids(endpoints: Iterable[str]) -> list[int]:
    """The processes serving those of ``endpoints`` (``HOST:PORT``) that listen on this
    machine's loopback (this process excluded), and, where such a process relays to
    another one listening on loopback (a network emulator, a local tunnel), that one too."""
    ports = set()
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if port.isdigit() and _on_loopback(host):
            ports.add(int(port))
    found: set[int] = set()
    for _ in range(_HOPS):
        if not ports:
            break
        sockets = _sockets()
        listening = {s.inode for s in sockets if s.state == _LISTEN and s.port in ports}
        onward = {s.inode: s.peer for s in sockets if s.state == _ESTABLISHED}
        held = _holders(listening | set(onward))  # one pass over /proc for both
        servers = {pid for pid, inodes in held.items() if inodes & listening} - found
        found |= servers
        # Where those servers connect on to another listener on loopback, it serves too.
        ports = {
            onward[inode][1]
            for pid in servers
            for inode in held[pid] - listening
            if ipaddress.ip_address(onward[inode][0]).is_loopback
        }
    return sorted(found)


def cpu_ticks(processes: Iterable[int]) -> float:
    """User and system CPU time of ``processes`` so far, in clock ticks (a process gone
    counts nothing)."""
    ticks = 0.0
    for pid in processes:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after the command's name, which may hold spaces
            ticks += float(fields[11]) + float(fields[12])  # utime and stime (fields 14 and 15)
    return ticks
