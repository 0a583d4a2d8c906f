"""A TCP relay that holds every chunk for a set delay each way: a network's latency between
two processes on one machine, where the kernel has no ``netem`` to add it.

    python tools/netdelay.py --listen 127.0.0.1:50100 --to 127.0.0.1:50052 --delay-ms 5

Each chunk read from one side is written to the other at its arrival time plus the delay,
in order, byte for byte; chunks read meanwhile wait in a queue of their own, so several are
in flight at once, as on a wire (a pipe with latency, not a rate limiter). A connection
closed on one side is closed the same way on the other once what it sent has arrived.
Loopback addresses only: this emulates a network, it is not a proxy to reach one.
Ctrl-C (or SIGTERM) stops it and prints what went each way: bytes, chunks, and bursts (a
burst is the chunks one side sends before the other side speaks again; a client waiting for
each reply pays one round trip, two delays, per burst of replies).

From Python (standard library only, importable as ``tools.netdelay``)::

    relay = Relay("127.0.0.1:0", "127.0.0.1:50052", delay_ms=5).start()
    ...  # connect to relay.address
    relay.stop(); print(relay.counters["down"].bursts)
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace

CHUNK = 64 * 1024  # the most one read takes
IN_FLIGHT = 256  # chunks held per direction and connection before reading stops (TCP pushes back)
UP, DOWN = "up", "down"  # client to upstream (the worker), upstream to client
_EOF = b""


class RelayError(ValueError):
    """A bad address: the command line prints it as one line."""


@dataclass
class Counters:
    bytes: int = 0  # released to the other side
    chunks: int = 0  # released, one per read
    bursts: int = 0  # runs of chunks this way, each begun after the other way spoke

    def line(self) -> str:
        return f"{self.bytes} bytes in {self.chunks} chunks, {self.bursts} bursts"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` with a loopback host (``localhost``, ``127.x.y.z``, ``[::1]``)."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise RelayError(f"netdelay: {text!r} is not HOST:PORT")
    literal = "127.0.0.1" if host == "localhost" else host
    try:
        loopback = ipaddress.ip_address(literal).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise RelayError(f"netdelay: {host!r} is not a loopback address; the relay emulates a network "
                         f"on one machine and stays on loopback")  # fmt: skip
    return literal, int(port_text)


class _Link:
    """One client connection and its upstream one: two directions, each a reader that stamps
    every chunk with its release time and a writer that delivers it then."""

    def __init__(self, relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        self.relay, self.client, self.upstream = relay, client, upstream
        self.last: str | None = None  # the direction of the last chunk read, for bursts
        self.lock = threading.Lock()
        self.open_writers = 2
        self.closed = threading.Event()
        self.threads: list[threading.Thread] = []
        for direction, src, dst in ((UP, client, upstream), (DOWN, upstream, client)):
            held: queue.Queue[tuple[float, bytes]] = queue.Queue(IN_FLIGHT)
            self.threads += [
                threading.Thread(target=self._read, args=(direction, src, held), daemon=True),
                threading.Thread(target=self._write, args=(direction, dst, held), daemon=True),
            ]
        for thread in self.threads:
            thread.start()

    def _read(self, direction: str, src: socket.socket, held: queue.Queue) -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = _EOF
            arrival = time.monotonic()
            if data:
                with self.lock:
                    if self.last != direction:
                        self.relay._count(direction, bursts=1)
                    self.last = direction
            if not self._hand_over(held, (arrival + self.relay.delay_s, data)) or not data:
                return

    def _hand_over(self, held: queue.Queue, item: tuple[float, bytes]) -> bool:
        """Queue ``item``, waiting while the queue is full; False once the link is closed."""
        while not self.closed.is_set():
            try:
                held.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _write(self, direction: str, dst: socket.socket, held: queue.Queue) -> None:
        try:
            while not self.closed.is_set():
                try:
                    release, data = held.get(timeout=0.1)
                except queue.Empty:
                    continue
                wait = release - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    dst.shutdown(socket.SHUT_WR)  # the sender closed: so does the relay, in turn
                    return
                self.relay._count(direction, size=len(data))  # first: whoever reads it sees it counted
                dst.sendall(data)
        except OSError:
            self.close()  # the other side is gone: end both directions
        finally:
            with self.lock:
                self.open_writers -= 1
                done = self.open_writers == 0
            if done:
                self.close()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class Relay:
    """Listens on ``listen`` (port 0: any free one, see ``address``) and relays each
    connection to ``to`` with ``delay_ms`` added to every chunk each way."""

    def __init__(self, listen: str, to: str, delay_ms: float = 0.0) -> None:
        if delay_ms < 0:
            raise RelayError(f"netdelay: the delay must be 0 or more milliseconds (got {delay_ms})")
        self.listen, self.to = parse_address(listen), parse_address(to)
        self.delay_s = delay_ms / 1000
        self.counters = {UP: Counters(), DOWN: Counters()}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._links: list[_Link] = []

    @property
    def address(self) -> str:
        """Where clients connect: ``HOST:PORT``, the port the system gave if asked for 0."""
        if self._server is None:
            raise RuntimeError("the relay is not started")
        host, port = self._server.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> Relay:
        family = socket.AF_INET6 if ":" in self.listen[0] else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(self.listen)
        except OSError as e:
            server.close()
            where = f"{self.listen[0]}:{self.listen[1]}"
            raise RelayError(f"netdelay: cannot listen on {where} ({e.strerror})") from None
        server.listen(16)
        server.settimeout(0.1)  # so that stop() is seen without waking accept() by force
        self._server = server
        self._accepting = threading.Thread(target=self._accept, daemon=True, name="netdelay")
        self._accepting.start()
        return self

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.to, timeout=10)
            except OSError:
                client.close()  # nothing listens upstream: the client sees its connection end
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                # What is sent is sent at once: the delay is the relay's, not Nagle's.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopping.is_set():
                    client.close()
                    upstream.close()
                    return
                self._links.append(_Link(self, client, upstream))

    def _count(self, direction: str, size: int = 0, bursts: int = 0) -> None:
        with self._lock:
            c = self.counters[direction]
            if size:
                c.bytes += size
                c.chunks += 1
            c.bursts += bursts

    def snapshot(self) -> dict[str, Counters]:
        """The counters now, each direction a copy (read before and after a run, subtract)."""
        with self._lock:
            return {direction: replace(c) for direction, c in self.counters.items()}

    def stop(self) -> None:
        """Stop listening and end every connection; what was held and not yet delivered is
        dropped, as on a cut cable."""
        self._stopping.set()
        if self._accepting is not None:
            self._accepting.join(timeout=5)
        if self._server is not None:
            self._server.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        for link in links:
            for thread in link.threads:
                thread.join(timeout=5)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def report(self) -> str:
        counts = self.snapshot()
        return (f"client→upstream: {counts[UP].line()}\n"
                f"upstream→client: {counts[DOWN].line()}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netdelay", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT", help="where clients connect")
    parser.add_argument("--to", required=True, metavar="HOST:PORT", help="where chunks go on to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added to every chunk, each way")
    args = parser.parse_args(argv)
    try:
        relay = Relay(args.listen, args.to, args.delay_ms).start()
    except RelayError as e:
        print(e, file=sys.stderr)
        return 2
    stop = threading.Event()
    # Both set here, not inherited: a shell's background job starts with SIGINT ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"netdelay: {relay.address} → {args.to}, {args.delay_ms:g} ms each way (Ctrl-C stops)", flush=True)
    while not stop.wait(0.5):
        pass
    relay.stop()
    print(relay.report(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
