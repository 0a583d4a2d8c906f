"""A split target's worker on this machine: found by its listening socket, and its CPU
counted as this process's own work while costs are measured (not as another program's
load). Real processes, real sockets, Linux's own counters."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_costs import usable_cores

from edgespec.runtime import local_workers

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux's /proc only")

# A stand-in worker: listens on a loopback port (printed), then spins on the core it is given.
LISTENER = """
import os, socket, sys
if sys.argv[1] != "-1":
    os.sched_setaffinity(0, [int(sys.argv[1])])
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
while True:
    pass
"""


def start_listener(core: int = -1) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-c", LISTENER, str(core)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def test_a_worker_listening_on_loopback_is_found_by_its_port():
    worker, port = start_listener()
    try:
        assert local_workers.pids([f"127.0.0.1:{port}"]) == [worker.pid]
        assert local_workers.pids([f"localhost:{port}"]) == [worker.pid]
        with socket.socket() as closed:  # a port nobody listens on
            closed.bind(("127.0.0.1", 0))
            nobody = closed.getsockname()[1]
        assert local_workers.pids([f"127.0.0.1:{nobody}"]) == []
        assert local_workers.pids(["192.0.2.7:50052"]) == []  # another machine's: not ours to count
        before = local_workers.cpu_ticks([worker.pid])
        time.sleep(0.5)
        assert local_workers.cpu_ticks([worker.pid]) > before  # it spins
    finally:
        worker.kill()
        worker.wait()
    assert local_workers.cpu_ticks([worker.pid]) == 0.0  # gone: nothing


def test_a_worker_behind_a_relay_on_loopback_is_found_through_it():
    """The network emulator of the split benchmark (``tools/netdelay.py``) listens where
    the target connects and connects on to the worker: both serve the target's passes."""
    worker, port = start_listener()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        relay_port = probe.getsockname()[1]
    relay = subprocess.Popen(
        [sys.executable, str(REPO / "tools" / "netdelay.py"), "--listen", f"127.0.0.1:{relay_port}",
         "--to", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert relay.stdout is not None
        relay.stdout.readline()  # listening from here on
        with socket.create_connection(("127.0.0.1", relay_port)):  # the relay connects on now
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                found = local_workers.pids([f"127.0.0.1:{relay_port}"])
                if found == sorted([relay.pid, worker.pid]):
                    break
                time.sleep(0.05)
            assert found == sorted([relay.pid, worker.pid])
    finally:
        for process in (relay, worker):
            process.kill()
            process.wait()


# At least this much of a core is the worker's, even with two other programs spinning there.
WORKER_SHARE = 0.25
# A child pinned to one core measures others' load there while a stand-in worker spins on
# the same core; with its address among the workers this process was placed on or not.
WATCH = """
import os, sys, time
from edgespec.decoding.costs import OtherLoad
from edgespec.runtime import rpc_faults
os.sched_setaffinity(0, [int(sys.argv[1])])
if sys.argv[3] == "ours":
    rpc_faults._workers.add(f"127.0.0.1:{sys.argv[2]}")
time.sleep(0.2)
watch = OtherLoad()
time.sleep(0.6)
print(watch.cores())
"""


@pytest.mark.skipif(len(usable_cores()) < 2, reason="needs Linux and two cores")
def test_the_cpu_of_this_process_workers_on_loopback_is_not_other_load():
    mine = min(os.sched_getaffinity(0))

    def seen(port: int, whose: str) -> float:
        out = subprocess.run([sys.executable, "-c", WATCH, str(mine), str(port), whose],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return float(out.stdout)

    worker, port = start_listener(mine)
    tries = []
    try:
        for _ in range(3):
            stranger, ours = seen(port, "stranger"), seen(port, "ours")
            # The worker's share of the core is other load as a stranger's only: what else
            # runs there (a busy machine) counts either way, so the two differ by its share.
            if stranger > 0.5 and stranger - ours > WORKER_SHARE:
                return
            tries.append(f"as another program's {stranger:.2f} cores, as ours {ours:.2f}")
    finally:
        worker.kill()
        worker.wait()
    pytest.fail(f"a loopback worker's CPU is not told apart: {tries}")
