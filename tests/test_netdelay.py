"""``tools/netdelay.py``: the relay the split-target benchmark emulates a network with, against
a real echo server on loopback (bytes, order, delay each way, chunks in flight at once, the
counters, the command line and its Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.netdelay import Relay, RelayError, parse_address

ROOT = Path(__file__).resolve().parent.parent


class EchoServer:
    """Sends back every byte it reads, on every connection, and closes its side after the
    client closes its own."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


def _connect(address: str) -> socket.socket:
    host, port = parse_address(address)
    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(n - len(out))
        assert data, f"the connection ended after {len(out)} of {n} bytes"
        out += data
    return bytes(out)


def _round_trip(sock: socket.socket) -> float:
    start = time.perf_counter()
    sock.sendall(b"x")
    assert _read_exactly(sock, 1) == b"x"
    return time.perf_counter() - start


def test_bytes_arrive_identical_and_in_order_both_ways(echo: EchoServer):
    """Megabytes sent in uneven pieces come back the same, through a delay that keeps many
    chunks in flight; the close travels too, after the last byte."""
    payload = os.urandom(3 * 1024 * 1024 + 17)
    with Relay("127.0.0.1:0", echo.address, delay_ms=5) as relay, _connect(relay.address) as sock:
        received = bytearray()

        def read_all() -> None:
            while data := sock.recv(65536):
                received.extend(data)

        reader = threading.Thread(target=read_all)
        reader.start()
        sizes = [1, 7, 4096, 65536, 100_000, 3]
        offset, i = 0, 0
        while offset < len(payload):
            piece = payload[offset : offset + sizes[i % len(sizes)]]
            sock.sendall(piece)
            offset, i = offset + len(piece), i + 1
        sock.shutdown(socket.SHUT_WR)
        reader.join(timeout=60)
        assert not reader.is_alive(), "the echo's close did not come through"
        counts = relay.snapshot()
    assert bytes(received) == payload
    assert counts["up"].bytes == counts["down"].bytes == len(payload)
    assert counts["up"].chunks >= 1 and counts["down"].chunks >= 1


def test_a_round_trip_pays_the_delay_each_way(echo: EchoServer):
    with Relay("127.0.0.1:0", echo.address, delay_ms=20) as relay, _connect(relay.address) as sock:
        trips = [_round_trip(sock) for _ in range(3)]
    assert min(trips) >= 0.040, trips


def test_chunks_are_in_flight_at_once_not_one_after_another(echo: EchoServer):
    """Twenty messages sent a millisecond apart through a 20 ms relay come back in about one
    round trip plus the sending time; a relay that held one chunk at a time, or paid the
    delay per chunk rather than from each one's arrival, would need 400 ms or more."""
    with Relay("127.0.0.1:0", echo.address, delay_ms=20) as relay, _connect(relay.address) as sock:
        start = time.perf_counter()
        for i in range(20):
            sock.sendall(bytes([i]))
            time.sleep(0.001)
        assert _read_exactly(sock, 20) == bytes(range(20))
        elapsed = time.perf_counter() - start
    assert 0.040 <= elapsed < 0.300, elapsed


def test_no_delay_adds_nearly_nothing(echo: EchoServer):
    with _connect(echo.address) as direct:
        plain = statistics.median(_round_trip(direct) for _ in range(30))
    with Relay("127.0.0.1:0", echo.address, delay_ms=0) as relay, _connect(relay.address) as sock:
        relayed = statistics.median(_round_trip(sock) for _ in range(30))
    # Generous: a busy 2-core machine wakes threads late; a 1 ms emulated delay is twice this.
    assert relayed - plain < 0.010, (plain, relayed)


def test_counters_count_bytes_chunks_and_each_exchange_as_a_burst(echo: EchoServer):
    with Relay("127.0.0.1:0", echo.address, delay_ms=1) as relay, _connect(relay.address) as sock:
        for _ in range(5):
            sock.sendall(b"ping")
            assert _read_exactly(sock, 4) == b"ping"
        counts = relay.snapshot()
    assert counts["up"].bytes == counts["down"].bytes == 20
    assert counts["up"].bursts == counts["down"].bursts == 5
    assert 5 <= counts["down"].chunks <= 20


def test_an_upstream_that_does_not_listen_ends_the_client_connection():
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    relay = Relay("127.0.0.1:0", f"127.0.0.1:{port}", delay_ms=0).start()
    # An ended connection either way: closed, or reset.
    with _connect(relay.address) as sock, contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b""
    relay.stop()


@pytest.mark.parametrize(
    "listen, to",
    [
        ("0.0.0.0:0", "127.0.0.1:50052"),
        ("127.0.0.1:0", "192.168.1.20:50052"),
        ("127.0.0.1:0", "example.com:50052"),
        ("[::]:0", "127.0.0.1:50052"),
    ],
)
def test_non_loopback_addresses_are_refused(listen: str, to: str):
    with pytest.raises(RelayError, match="not a loopback address") as caught:
        Relay(listen, to, delay_ms=1)
    assert "\n" not in str(caught.value)
    for text in ("localhost:1", "127.0.0.2:80", "[::1]:9"):
        assert parse_address(text)[1] > 0


def test_the_command_line_refuses_a_non_loopback_address_in_one_line():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "netdelay.py"), "--listen", "0.0.0.0:0", "--to", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "loopback" in result.stderr


def test_the_command_line_relays_and_prints_its_counters_on_ctrl_c(echo: EchoServer):
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "netdelay.py"), "--listen", f"127.0.0.1:{port}",
         "--to", echo.address, "--delay-ms", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "5 ms each way" in proc.stdout.readline()  # listening from here on
        with _connect(f"127.0.0.1:{port}") as sock:
            sock.sendall(b"hello relay")
            assert _read_exactly(sock, 11) == b"hello relay"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "client→upstream: 11 bytes" in out and "upstream→client: 11 bytes" in out
