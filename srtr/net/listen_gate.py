"""Admission of unauthenticated connections: what a peer without the job's credentials may
cost a listener before it proved itself.

Every listener of a job (the agent channel, its heartbeats, the control port) accepts
through a `Gate` instead of asyncio's own accept loop, because on a shared host anyone can
connect, and each connection costs a descriptor and memory until it proves itself:

- at most `max_pending` connections of a listener are unproved at once; at that count the
  gate stops accepting, and the rest wait in the kernel's backlog (costing the job nothing)
  until one proves itself or is closed. A thousand agents that dial at once only wait;
- at most `per_source` of them come from one address (every loopback address counts as one:
  a local user can bind any of 127.0.0.0/8); a new connection beyond that is closed at once;
- each is closed `deadline` seconds after it was accepted unless it proved itself
  (`Ticket.proved`), TLS handshake included.

Nothing is logged per dropped connection: one summary line per `SUMMARY_EVERY` seconds
(`Summary`) says how many were dropped and refused, and an accept that fails (EMFILE under a
descriptor flood) pauses the gate for a second and is logged at most once per interval, never
with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("srtr")

SUMMARY_EVERY = 10.0  # seconds between two summary lines of one listener
ACCEPT_RETRY = 1.0  # an accept that failed (out of descriptors) is retried after this
_BATCH = 256  # accepts per wake-up at most: others' callbacks run in between


def source_of(address: object) -> str:
    """The key a peer's address counts under: its IP, every loopback address as one."""
    host = address[0] if isinstance(address, tuple) and address else str(address)
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return str(host)[:64]
    if ip.is_loopback or (
        isinstance(ip, ipaddress.IPv6Address)
        and ip.ipv4_mapped is not None
        and ip.ipv4_mapped.is_loopback
    ):
        return "loopback"
    return str(ip)


def shown(text: object, limit: int = 120) -> str:
    """`text` as a log may carry it: escaped (`!r`: no newline, no terminal escape), cut."""
    quoted = repr(str(text))
    return quoted if len(quoted) <= limit else quoted[: limit - 4] + "...'"


class Summary:
    """Counts of what a listener refused, logged as one line per `every` seconds at most."""

    def __init__(self, name: str, every: float = SUMMARY_EVERY) -> None:
        self.name = name
        self.every = every
        self.counts: Counter[str] = Counter()
        self.total: Counter[str] = Counter()  # since the start, for tests and status
        self._last = -every
        self._timer: asyncio.TimerHandle | None = None

    def count(self, what: str) -> None:
        self.counts[what] += 1
        self.total[what] += 1
        now = time.monotonic()
        if now - self._last >= self.every:
            self.flush()
        elif self._timer is None:
            with contextlib.suppress(RuntimeError):  # no loop: the next count flushes
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self._last + self.every - now, self.flush)

    def flush(self) -> None:
        self._timer = None
        if not self.counts:
            return
        self._last = time.monotonic()
        parts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
        log.warning("%s: in the last %gs: %s", self.name, self.every, parts)
        self.counts.clear()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.flush()


@dataclass(frozen=True)
class Limits:
    """What a listener allows before a connection proved itself."""

    max_pending: int  # unproved at once; then the gate stops accepting
    per_source: int  # unproved from one address; more are dropped
    deadline: float  # seconds from accept to proof, TLS handshake included


@dataclass(eq=False)
class Ticket:
    """One accepted, not yet proved connection: its slot at the gate."""

    gate: Gate
    source: str
    expire: Callable[[], None] | None = None  # closes the connection at the deadline
    done: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def proved(self) -> None:
        """It proved itself: it leaves the gate's count, and no deadline ends it."""
        self.gate.release(self)

    def closed(self) -> None:
        """It ended before it proved itself (the same slot freed; harmless when repeated)."""
        self.gate.release(self)


Serve = Callable[[socket.socket, Ticket], None]


class Gate:
    """Accepts on `sock` for `serve(conn, ticket)`, within `limits`."""

    def __init__(
        self,
        name: str,
        sock: socket.socket,
        serve: Serve,
        limits: Limits,
    ) -> None:
        self.name = name
        self.sock = sock
        self._serve = serve
        self.max_pending = limits.max_pending
        self.per_source = limits.per_source
        self.deadline = limits.deadline
        self.pending = 0
        self._sources: Counter[str] = Counter()
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._accept_errors = 0
        self._error_logged = -SUMMARY_EVERY
        self.summary = Summary(name)
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._resume()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _resume(self) -> None:
        if not self._reading and not self._closed and self.pending < self.max_pending:
            self._loop.add_reader(self.sock.fileno(), self._accept)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(_BATCH):
            if self.pending >= self.max_pending:
                self._pause()  # the rest wait in the backlog until a slot frees
                return
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: out of something; wait
                self._accept_failed(exc)
                return
            self._admit(conn, address)

    def _admit(self, conn: socket.socket, address: object) -> None:
        source = source_of(address)
        if self._sources[source] >= self.per_source:
            self.summary.count(f"dropped over {self.per_source} unproved from one address")
            _drop(conn)
            return
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets this itself only on sockets it made (proto 6); these are
            # `create_server`'s (proto 0): without it a reply waits for the peer's
            # delayed ACK (Nagle), 40 ms per round trip of every intent and agent answer.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending += 1
        self._sources[source] += 1
        ticket = Ticket(self, source)
        ticket.timer = self._loop.call_later(self.deadline, self._expired, ticket)
        try:
            self._serve(conn, ticket)
        except Exception as exc:  # one connection must not end the listener
            self.summary.count(f"failed to serve ({type(exc).__name__})")
            self.release(ticket)
            _drop(conn)

    def _accept_failed(self, exc: OSError) -> None:
        self._accept_errors += 1
        now = time.monotonic()
        if now - self._error_logged >= SUMMARY_EVERY:
            self._error_logged = now
            log.warning(
                "%s: cannot accept connections (%s); %d time(s) since the last line; "
                "retrying every %gs",
                self.name,
                exc.strerror or exc,
                self._accept_errors,
                ACCEPT_RETRY,
            )
            self._accept_errors = 0
        self._pause()
        self._retry = self._loop.call_later(ACCEPT_RETRY, self._resume)

    def _expired(self, ticket: Ticket) -> None:
        if ticket.done:
            return
        self.summary.count(f"closed, not proved within {self.deadline:g}s")
        expire = ticket.expire
        self.release(ticket)
        if expire is not None:
            expire()

    def release(self, ticket: Ticket) -> None:
        if ticket.done:
            return
        ticket.done = True
        if ticket.timer is not None:
            ticket.timer.cancel()
        self.pending -= 1
        self._sources[ticket.source] -= 1
        if self._sources[ticket.source] <= 0:
            del self._sources[ticket.source]
        self._resume()

    def close(self) -> None:
        self._closed = True
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
        self.summary.close()
        self.sock.close()


def _drop(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()


def listen(host: str, port: int = 0, *, backlog: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when `host` is one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog, reuse_port=False)
