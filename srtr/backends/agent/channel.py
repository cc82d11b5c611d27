"""The controller's end of the agents' connections: accept, authenticate, watch heartbeats.

`AgentServer` listens on one TCP port of the controller's machine (an ephemeral port on the
address the nodes route to; 127.0.0.1 locally). Each connection must prove it holds the job's
token (`protocol`: challenge, HMAC proof, counter-proof) and name a node of the allocation
that has no live agent yet; anything else is closed. Once accepted, every message goes to the
`Handler`, and the connection's end, or a silence longer than `silence` seconds, is reported
once through `Handler.gone`.

With a TLS context (`tls`: the job's certificate, `certs`; how `srtr up` always runs it)
every connection is TLS 1.3: the handshake comes first, then the same lines, encrypted. The
socket stays a plain asyncio transport, and `tls_bytes.TlsBytes` encrypts and decrypts its
bytes, so that the batch reader below can go on reading raw fds. The agents pin the
certificate's fingerprint (`srtr.net.tls`); the token's proofs still authenticate both ends.

A stalled event loop (a long state.json write under load) must not read as silent agents:
the watcher only counts silence while it runs on time itself.

Heartbeats: a frame a second between the stream's records on the agent's one connection
(`frames`), on whole seconds of the wall clock (`lease.Lease.beat`): the controller holds
ONE descriptor per agent, so 10,000 agents fit a host's 20,000 (`FDS_PER_AGENT`). A
heartbeat never wakes the loop: the watcher sees it arrive in an epoll of its own (`beats`)
at its next look, and the connection counts as heard at that look (never earlier than the
bytes came, which the lease below needs), or when a read took its bytes before that look
(a look reports only the sockets still holding some), so a silent agent is lost at most
SILENCE + WATCH after its last heartbeat. The socket itself is read once every READ_PERIOD,
a slice of the connections at each look: docs/agents.md, "One connection per agent", has
the design, its figures and its limits.
From 16 nodes on, relays (`relayed`) take a node's socket out of that epoll while its
relay vouches for it, never deciding a loss: docs/agents.md, "Relays".

The lease, kept by TCP: an agent whose heartbeats the controller's kernel has stopped
acknowledging for LEASE seconds fences itself (`node`, "The lease"), so the controller knows,
by its own clock, that an agent it last heard at `last_seen` stopped its instances by
`last_seen + LEASE + their grace`. That holds because a lost connection is reset (SO_LINGER 0)
the moment it is judged lost: no heartbeat is acknowledged after the controller stopped
counting them. A controller that is only stalled still has its kernel acknowledging, so its
agents keep their work, and its watcher does not count its own stall as their silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from srtr.backends.agent import protocol as p
from srtr.backends.agent.beats import BeatSockets, newest_arrival
from srtr.backends.agent.coalesced import CoalescedReader
from srtr.backends.agent.frames import KEY, ForgedBeat, Splitter
from srtr.backends.agent.relayed import Relays, SocketSwitch
from srtr.backends.agent.tls_bytes import TlsBytes
from srtr.net.listen_gate import Gate, Limits, Ticket, listen, shown

log = logging.getLogger("srtr")

HEARTBEAT = 1.0  # how often agents send one
SILENCE = 2.5  # an agent not heard from for this long is gone
LEASE = 5.0  # an agent with no heartbeat acknowledged for this long fences itself
WATCH = 0.25  # how often the watcher looks (at most)
# The controller's descriptors per agent: its one connection (the start-up refusal check).
FDS_PER_AGENT = 1
BACKLOG = 4096  # a thousand agents dial at once: no SYN may wait for TCP's 1 s retry
# Before a connection proved itself (`listen_gate`): how long it may take, TLS handshake
# included; how many may be unproved at once (the rest wait in the backlog: more agents than
# that dialling at once are only delayed; at 512 the pauses cost a thousand joining agents
# ~10 % more of the controller's CPU); how many of those from one address (a host's hollow
# or local agents share one, so it is the same bound); and the longest hello read before its
# proof is checked (an adopted node's hello lists its live attempts: ~50 bytes each). At
# most ~1,024 x (32 KiB + a TLS session) then: tens of MB, where 40 idle peers took 650 MB.
PROOF_DEADLINE = 5.0
MAX_PENDING = 1024
PER_SOURCE = 1024
MAX_HELLO = 32 * 1024
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
# How often an agent's socket is read (its heartbeats' tags checked, its receive buffer
# emptied, a message whose doorbell was lost found): a slice of the sockets at each look.
# Its receive queue then holds 16 heartbeats (9 bytes each: the kernel merges them, ~1 KB
# of receive memory measured). A connection whose read found a message no doorbell
# announced is read at every look that saw bytes arrive on it (docs/agents.md).
READ_PERIOD = 16.0
# A socket whose relay vouches for it (`relayed`) is read in one lap of every RELAYED_LAPS
# (every 256 s; each lap reads an even share of them): its heartbeats say nothing the relay
# does not, its doorbells come again once their byte could be late (`dial.Wire`), and at
# 10,000 agents the rounds' reads were most of an idle controller's CPU. A read of 256
# queued heartbeats costs what one of 64 does (docs/design/relays.md).
RELAYED_LAPS = 16
# What wakes the loop for an agent's socket (`coalesced`): a message's doorbell (urgent
# data), or its end. Not plain bytes: a heartbeat must not wake it.
_DOORBELL = select.EPOLLPRI | select.EPOLLRDHUP


class Transport(Protocol):
    """What the channel writes to: an asyncio transport, or `TlsBytes` over one."""

    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def _unheard() -> float | None:
    return None


@dataclass(eq=False)
class Connection:
    """One authenticated agent."""

    node: str
    pid: int
    transport: Transport
    since: float = field(default_factory=time.monotonic)  # when it was admitted
    gone: bool = False
    # [name, attempt, pid, start] of the attempts the agent kept through a controller crash.
    live: list[list[Any]] = field(default_factory=list)
    beats: int = 0  # heartbeats read so far
    # Lines sent in this turn of the loop, written together at its end (`send`).
    outbox: list[bytes] = field(default_factory=list)
    # When the watcher last saw bytes arrive on it (`beats.BeatSockets.heard_at`).
    heard_at: Callable[[], float | None] = field(default=_unheard, repr=False)

    @property
    def last_seen(self) -> float:
        """When it was last heard: the watcher's last look that saw bytes arrive on it (never
        earlier than they came, as the lease needs), or its admission."""
        heard = self.heard_at()
        return self.since if heard is None else max(heard, self.since)

    def send(self, message: p.Message) -> None:
        """Queue `message`; a connection that is closing drops it (its end is reported).

        What one turn of the loop sends an agent (a node's launches, a teardown's signals)
        leaves as one write, so one TLS record, instead of one each."""
        if self.gone or self.transport.is_closing():
            return
        self.outbox.append(p.encode(message))
        if len(self.outbox) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what `send` queued."""
        lines, self.outbox = self.outbox, []
        if not lines or self.gone or self.transport.is_closing():
            return
        with contextlib.suppress(OSError):
            self.transport.write(lines[0] if len(lines) == 1 else b"".join(lines))

    def close(self, *, reset: bool = False) -> None:
        """Close it; `reset`: no heartbeat in flight gets acknowledged after this (a lost
        node's lease must stop at our last look, "The lease" above)."""
        if not reset:
            self.flush()  # what this turn sent goes before the end
        if reset:
            with contextlib.suppress(OSError, AttributeError):
                sock = self.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            abort = getattr(self.transport, "abort", None)
            if abort is not None:
                abort()
                return
        self.transport.close()


class Handler(Protocol):
    def connected(self, conn: Connection) -> None: ...

    def received(self, conn: Connection, message: p.Message) -> None: ...

    def gone(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        """`conn` ended: its agent closed it or broke it (the agent died; its node's kernel
        lives, as it answered), or, `silent`, it stopped talking (a hung or dead node)."""
        ...

    def refuse(self, node: str) -> str | None:
        """Why an agent of `node` may not connect now, or None when it may."""
        ...

    def awaiting(self) -> bool:
        """True while some request awaits an agent's answer (`coalesced`: read at once)."""
        ...


class AgentServer:
    """Listens for agents; authenticates them; watches them."""

    def __init__(
        self,
        token: str,
        handler: Handler,
        *,
        heartbeat: float = HEARTBEAT,
        silence: float = SILENCE,
        lease: float = LEASE,
        tls: ssl.SSLContext | None = None,
        read_period: float | None = None,
        relayed: Sequence[str] = (),
    ) -> None:
        """`read_period`: how often each socket is read (`READ_PERIOD` unless given);
        `relayed`: the allocation's nodes, in order, for the relay groups (`relayed`)."""
        self._token = token
        self.tls = tls
        self._handler = handler
        self.heartbeat = heartbeat
        self.silence = silence
        self.lease = lease
        self._server: Gate | None = None
        self._opening: set[asyncio.Task[Any]] = set()
        self._conns: dict[Connection, None] = {}
        self._watcher: asyncio.Task[None] | None = None
        self.reader = CoalescedReader(_RECEIVED, handler.awaiting)
        self.period = min(WATCH, heartbeat / 2)  # the watcher's
        rounds = max(1, round((read_period or READ_PERIOD) / self.period))
        self.beats: BeatSockets[_AgentProtocol] = BeatSockets(rounds, RELAYED_LAPS)
        self.draining = False  # while the watcher reads its round's sockets
        switch = SocketSwitch(self.beats, self._read)
        self.relays: Relays[_AgentProtocol] = Relays(relayed, switch, heartbeat)
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on an ephemeral port of `host`; return the (host, port) agents dial."""
        limits = Limits(MAX_PENDING, PER_SOURCE, PROOF_DEADLINE)
        self._server = Gate("agents", listen(host, backlog=BACKLOG), self._serve_agent, limits)
        self.address = (host, self._server.port)
        self._watcher = asyncio.create_task(self._watch())
        return self.address

    def _serve_agent(self, sock: socket.socket, ticket: Ticket) -> None:
        self._open(sock, ticket, _AgentProtocol(self, ticket))

    def _open(self, sock: socket.socket, ticket: Ticket, protocol: asyncio.BaseProtocol) -> None:
        """A transport for an accepted socket, made at once as asyncio's own accept loop
        makes it (a task per connection through `connect_accepted_socket` cost 5-10 % more
        of the controller's CPU while a thousand agents joined); that where the loop has no
        such method."""
        ticket.expire = sock.close  # until the transport exists; then the protocol's
        loop = asyncio.get_running_loop()
        make = getattr(loop, "_make_socket_transport", None)
        if make is not None:
            make(sock, protocol)
            return
        task = loop.create_task(loop.connect_accepted_socket(lambda: protocol, sock))
        self._opening.add(task)

        def opened(task: asyncio.Task[Any]) -> None:
            self._opening.discard(task)
            if task.cancelled() or task.exception() is not None:
                ticket.closed()
                sock.close()

        task.add_done_callback(opened)

    def refusals(self) -> dict[str, int]:
        """What the listeners refused so far, by what (tests, status)."""
        found: dict[str, int] = {}
        gate = self._server
        if gate is not None:
            for what, n in gate.summary.total.items():
                found[f"{gate.name}: {what}"] = n
        return found

    def connections(self) -> Iterable[Connection]:
        return list(self._conns)

    async def close(self) -> None:
        """Stop listening and watching, and close every connection."""
        if self._watcher is not None:
            self._watcher.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.close()
        for task in list(self._opening):
            task.cancel()
        await asyncio.sleep(0)  # the transports' closes run
        self.reader.close()
        self.beats.close()

    def _admit(self, hello: p.Message, transport: Transport, nonce: str, key: bytes) -> bool:
        """Answer an agent's first line: Welcome, or a refusal (False: close it)."""
        if not isinstance(hello, p.Hello):
            raise p.ProtocolError(f"expected hello, got {type(hello).__name__}")
        if not isinstance(hello.node, str) or not isinstance(hello.proof, str):
            raise p.ProtocolError("a hello names its node and proof in strings")
        if not p.verify(self._token, "agent", nonce, hello.node, hello.proof):
            # Nothing the peer wrote is logged: it has not proved it may write to our log.
            self._refused("wrong proof")
            return False
        refusal = self._handler.refuse(hello.node)
        if refusal is not None:
            log.warning(
                "agents: refused the agent of %s (pid %r): %s",
                shown(hello.node),
                hello.pid,
                refusal,
            )
            transport.write(p.encode(p.Shutdown(refusal)))
            return False
        proof = p.proof(self._token, "controller", hello.nonce, hello.node)
        welcome = p.Welcome(
            proof=proof, heartbeat=self.heartbeat, lease=self.lease, beat_key=key.hex()
        )
        transport.write(p.encode(welcome))
        return True

    def _refused(self, why: str) -> None:
        if self._server is not None:
            self._server.summary.count(f"refused ({why})")

    def _connected(self, conn: Connection) -> None:
        conn.since = time.monotonic()
        self._conns[conn] = None  # from now on its silence counts
        self._handler.connected(conn)

    def _end(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        self._conns.pop(conn, None)
        if conn.gone:
            return
        conn.gone = True
        conn.close(reset=silent)
        self._handler.gone(conn, why, silent=silent)

    async def _watch(self) -> None:
        period = self.period
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now, due = self.beats.look()
            if self.beats.rang:  # a doorbell whose byte came after its signal
                self.reader.ring()
            self._read(due)
            if now - last > 2 * period + 0.1:
                # We were not running: the agents' bytes may be waiting unseen.
                self.beats.heard_all(now)
                self.relays.stalled(now)
            else:
                try:
                    self.relays.check(now, self.beats.starved(due))
                except Exception:  # a bug there must not end the watcher (and so NodeLost)
                    log.exception("agents: checking the relays failed")
                cutoff = now - self.silence
                for agent in self.beats.silent(cutoff):
                    agent.silenced(now)
                self.beats.forget(cutoff)
            last = now

    def _read(self, fds: Iterable[int]) -> None:
        """Read `fds` (their heartbeats' tags checked, a message no doorbell announced
        found): the watcher's round."""
        self.draining = True
        try:
            for fd in fds:
                try:
                    self.reader.drain(fd)
                except Exception:  # a handler's bug must not end the watcher (and so NodeLost)
                    log.exception("agents: reading a connection failed")
        finally:
            self.draining = False

    def silent(self, now: float) -> list[Connection]:
        """The connections not heard from for longer than `silence` at `now`, longest
        silent first."""
        found = (agent.conn for agent in self.beats.silent(now - self.silence))
        return [conn for conn in found if conn is not None]


# Every connection reads into this one buffer: the loop fills it and hands it over in the
# same callback, and a plain protocol's read would allocate 256 KiB per heartbeat instead.
_RECEIVED = bytearray(64 * 1024)
_RECEIVED_VIEW = memoryview(_RECEIVED)


class _AgentProtocol(asyncio.BufferedProtocol):
    """One agent's connection: the handshake, then one message a line to the handler.

    A protocol, not a stream reader and a task: once admitted, a heartbeat costs one read in
    the server's batch and one call, no task wake-up, no allocation, no decode (`Cost` above)."""

    def __init__(self, server: AgentServer, ticket: Ticket) -> None:
        self._server = server
        self._ticket = ticket
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._tls: TlsBytes | None = None
        self._io: Transport | None = None  # what messages are written to: TLS, or the socket
        self._nonce = secrets.token_hex(16)
        self._fd = -1  # while the server's CoalescedReader reads it
        self._read_error: OSError | None = None
        self._frames = Splitter(secrets.token_bytes(KEY), tls=server.tls is not None)
        self._watched = False  # its socket is in the server's `beats`
        self._sock: socket.socket | None = None  # while watched: for its TCP_INFO
        self._heard: float | None = None  # when `beats` last heard it, once out of it
        self.conn: Connection | None = None

    @property
    def fd(self) -> int:
        """Its socket's descriptor while the server reads it; -1 before and after."""
        return self._fd

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        context = self._server.tls
        self._io = transport if context is None else TlsBytes(transport, context)
        self._tls = self._io if isinstance(self._io, TlsBytes) else None
        self._io.write(p.encode(p.Challenge(self._nonce)))  # TLS: sent after the handshake
        self._ticket.expire = transport.abort  # not proved within the gate's deadline

    def get_buffer(self, sizehint: int) -> memoryview:
        return _RECEIVED_VIEW

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        before = self._frames.beats
        try:
            stream = self._frames.feed(_RECEIVED_VIEW[:nbytes])
        except ForgedBeat as exc:
            if conn is None:
                self._refuse("a forged heartbeat")
            else:  # not our agent's bytes: its node counts as silent since it was heard
                self._server._end(
                    conn, f"its connection carried a forged heartbeat: {exc}", silent=True
                )
            return
        if self._watched:
            # Heard: the watcher's look, edge-triggered, would not report the bytes this
            # read took (a heartbeat read with the message after it, on its doorbell). The
            # watcher's own read takes bytes that may have waited since an earlier look:
            # heard as of when the newest came (TCP's record), not at the read.
            beats, fd = self._server.beats, self._fd
            drained = self._server.draining and not beats.is_parked(fd)  # parked: `relayed`
            beats.heard(fd, newest_arrival(self._sock) if drained else None)
        if conn is not None:
            conn.beats += self._frames.beats - before
            if stream and self._server.draining and self._watched:
                # The watcher's read found a message its doorbell did not announce (the
                # urgent flag cleared on the path): from now on read at every arrival.
                self._server.beats.read_always(self._fd)
        if self._tls is not None and stream:
            self._decrypted(stream)
            return
        if stream:
            self.data_received(stream)

    def _decrypted(self, stream: bytes) -> None:
        """`buffer_updated` over TLS: the same, on the plaintext of what arrived."""
        assert self._tls is not None
        try:
            data = self._tls.feed(stream)
        except ssl.SSLError as exc:
            if self.conn is not None:
                self._fail(f"TLS failed: {exc}")
            else:
                self._refuse("TLS failed")
            return
        if data:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None and not self._transport.is_closing():
            end = self._buffer.find(b"\n")
            if end < 0:
                if self.conn is None and len(self._buffer) > MAX_HELLO:
                    self._refuse("a hello over the limit")
                elif len(self._buffer) > p.MAX_LINE:
                    self._fail("its agent sent a line over the limit")
                return
            line = bytes(self._buffer[: end + 1])
            del self._buffer[: end + 1]
            self._line(line)

    def ended(self, exc: OSError | None) -> None:
        """The server's reader saw this connection end (or fail); asyncio reports it next."""
        self._unwatch()
        self._fd = -1
        self._read_error = exc
        if self._transport is not None:
            if exc is None:
                self._transport.close()
            else:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._ticket.closed()
        if self._fd >= 0:
            self._server.reader.remove(self._fd)
            self._unwatch()
            self._fd = -1
        exc = exc or self._read_error
        if self.conn is not None:
            why = (
                "its agent closed the connection" if exc is None else f"its connection broke: {exc}"
            )
            self._server._end(self.conn, why)

    def _line(self, line: bytes) -> None:
        conn = self.conn
        if conn is None:
            self._hello(line)
        elif line == p.BEAT:
            conn.beats += 1  # heard already: `buffer_updated`
        else:
            try:
                message = p.decode(line)
            except p.ProtocolError as exc:
                self._fail(f"its agent sent garbage: {exc}")
                return
            if isinstance(message, p.Relaying | p.Relayed):
                self._server.relays.received(self, message)
            else:
                self._server._handler.received(conn, message)

    def _hello(self, line: bytes) -> None:
        assert self._transport is not None and self._io is not None
        try:
            hello = p.decode(line)
            admitted = self._server._admit(hello, self._io, self._nonce, self._frames.key)
        except p.ProtocolError:
            self._refuse("not a hello")  # its text stays out of the log
            return
        if not admitted:
            self._transport.close()
            return
        assert isinstance(hello, p.Hello)
        self._ticket.proved()
        self.conn = Connection(
            node=hello.node,
            pid=hello.pid,
            transport=self._io,
            live=list(hello.live),
        )
        self._server._connected(self.conn)
        if not self._transport.is_closing():
            # From now on its messages are read in batches (`coalesced`) when their doorbell
            # rings, and its heartbeats only seen arrive (`beats`): "Heartbeats" above.
            self._transport.pause_reading()
            self._sock = self._transport.get_extra_info("socket")
            self._fd = self._sock.fileno()
            self._server.reader.add(self._fd, self, _DOORBELL)
            self._server.beats.add(self._fd, self)
            self._watched = True
            self.conn.heard_at = self._last_heard
            self._server.relays.joined(hello.node, self)

    @property
    def sock(self) -> socket.socket | None:
        return self._sock

    def send(self, message: p.Message) -> None:
        if self.conn is not None:
            self.conn.send(message)

    def _last_heard(self) -> float | None:
        """When it was last heard: by the watcher, or, while its relay vouches for it (its
        socket parked), as of its socket's newest bytes (the kernel's count)."""
        if self._watched and self._server.beats.is_parked(self._fd):
            return newest_arrival(self._sock)
        if self._watched:
            return self._server.beats.heard_at(self._fd)
        return self._heard

    def _unwatch(self) -> None:
        """Out of the watcher's sight, keeping when it last heard this connection."""
        if self._watched:
            self._heard = self._last_heard()
            self._server.relays.left(self)
            self._server.beats.remove(self._fd)
            self._watched = False

    def silenced(self, now: float) -> None:
        """The watcher heard nothing from it for longer than the silence: a lost node."""
        self._unwatch()
        conn = self.conn
        if conn is not None:
            silence = now - conn.last_seen
            self._server._end(conn, f"its agent was silent for {silence:.1f}s", silent=True)

    def _refuse(self, why: str) -> None:
        """Close a connection that has not proved itself: counted, not logged one by one."""
        if self._transport is not None and not self._transport.is_closing():
            self._server._refused(why)
            self._transport.abort()

    def _fail(self, why: str) -> None:
        if self.conn is not None:
            self._server._end(self.conn, why)
        elif self._transport is not None:
            self._transport.close()
