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

Heartbeats: each agent opens a second connection, plain TCP, to the beat port (`beat_port`,
same host), names itself with the `beat_token` its Welcome carried (a secret of this session,
sent only inside the TLS channel), and then writes one byte a second (`protocol.BEAT`), on
whole seconds of the wall clock (`lease.Lease.beat`). The controller never reads those bytes
one by one, and they never wake its loop: the beat sockets sit in an epoll of their own
(`beats`) that the watcher polls when it looks, every 0.25 s, so a heartbeat costs its share
of one epoll_wait and a dictionary lookup, no read, no decrypt; the bytes are drained every
`DRAIN_EVERY` heartbeats. At 1,024 hollow agents the idle controller went from 3.7 % of a
core (TLS heartbeat records decrypted, and renewals encrypted to every agent every 2 s) to
about the floor of an idle job (benchmarks/README). What a heartbeat carries is only that it
came: no secret crosses in the clear.

The connections are kept oldest-heard first, so the watcher reads only the silent ones and
the first live one. A heartbeat counts as heard when the watcher sees it (at most 0.25 s
after it came: never earlier than it was sent, which the lease below needs), so a silent
agent is lost at most SILENCE + 0.5 s after its last heartbeat.

The lease, kept by TCP: an agent whose heartbeats the controller's kernel has stopped
acknowledging for LEASE seconds fences itself (`node`, "The lease"), so the controller knows,
by its own clock, that an agent it last heard at `last_seen` stopped its instances by
`last_seen + LEASE + their grace`. That holds because a lost connection's beat socket is
reset (SO_LINGER 0) the moment it is judged lost: no heartbeat is acknowledged after the
controller stopped counting them. One timer and no write per agent: the renewals it replaced
were 512 TLS writes a second at 1,024 agents. A controller that is only stalled still has its
kernel acknowledging, so its agents keep their work, and its watcher does not count its own
stall as their silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from srtr.backends.agent import protocol as p
from srtr.backends.agent.beats import HANGUP, BeatSockets
from srtr.backends.agent.coalesced import CoalescedReader
from srtr.backends.agent.tls_bytes import TlsBytes

log = logging.getLogger("srtr")

HEARTBEAT = 1.0  # how often agents send one
SILENCE = 2.5  # an agent not heard from for this long is gone
LEASE = 5.0  # an agent with no heartbeat acknowledged for this long fences itself
WATCH = 0.25  # how often the watcher looks (at most)
HANDSHAKE_TIMEOUT = 10.0  # for the TLS handshake and hello, and for the beat connection after
BACKLOG = 4096  # a thousand agents dial at once: no SYN may wait for TCP's 1 s retry
# Heartbeat bytes are read (and dropped) once this many arrived: a byte a second, and the
# socket's receive buffer holds ~100 KiB.
DRAIN_EVERY = 4096
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class Transport(Protocol):
    """What the channel writes to: an asyncio transport, or `TlsBytes` over one."""

    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


@dataclass(eq=False)
class Connection:
    """One authenticated agent."""

    node: str
    pid: int
    transport: Transport
    last_seen: float = field(default_factory=time.monotonic)
    gone: bool = False
    # [name, attempt, pid, start] of the attempts the agent kept through a controller crash.
    live: list[list[Any]] = field(default_factory=list)
    beat_token: str = ""  # how its beat connection names it (`Welcome.beat_token`)
    beat: _Beat | None = None  # its beat connection, once it opened it
    beats: int = 0  # heartbeats seen so far

    def send(self, message: p.Message) -> None:
        """Queue `message`; a connection that is closing drops it (its end is reported)."""
        if self.gone or self.transport.is_closing():
            return
        with contextlib.suppress(OSError):
            self.transport.write(p.encode(message))

    def close(self, *, reset: bool = False) -> None:
        """Close it; `reset`: no heartbeat in flight gets acknowledged after this (a lost
        node's lease must stop at our last look, "The lease" above)."""
        if self.beat is not None:
            self.beat.close(reset=reset)
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
    ) -> None:
        self._token = token
        self.tls = tls
        self._handler = handler
        self.heartbeat = heartbeat
        self.silence = silence
        self.lease = lease
        self._server: asyncio.Server | None = None
        self._beat_server: asyncio.Server | None = None
        self.beat_port = 0
        # Admitted, their beat connection not yet open: by beat token; each ends if it does
        # not open one in time (`_unbeaten`).
        self._unclaimed: dict[str, Connection] = {}
        # Oldest-heard first (`heard` moves a connection to the end), so the watcher finds
        # the silent ones without a loop in Python over a thousand connections.
        self._conns: OrderedDict[Connection, None] = OrderedDict()
        self._watcher: asyncio.Task[None] | None = None
        self.reader = CoalescedReader(_RECEIVED, handler.awaiting)
        self.beats: BeatSockets[_Beat] = BeatSockets()
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on an ephemeral port of `host`; return the (host, port) agents dial."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _AgentProtocol(self), host, 0, backlog=BACKLOG
        )
        self._beat_server = await loop.create_server(lambda: _Beat(self), host, 0, backlog=BACKLOG)
        sock = self._server.sockets[0]
        self.address = (host, int(sock.getsockname()[1]))
        self.beat_port = int(self._beat_server.sockets[0].getsockname()[1])
        self._watcher = asyncio.create_task(self._watch())
        return self.address

    def connections(self) -> Iterable[Connection]:
        return [*self._unclaimed.values(), *self._conns]

    async def close(self) -> None:
        """Stop listening and watching, and close every connection."""
        if self._watcher is not None:
            self._watcher.cancel()
        servers = [s for s in (self._server, self._beat_server) if s is not None]
        for server in servers:
            server.close()
        for conn in [*self._unclaimed.values(), *self._conns]:
            conn.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                for server in servers:
                    await server.wait_closed()
        self.reader.close()
        self.beats.close()

    def _admit(self, hello: p.Message, transport: Transport, nonce: str) -> str | None:
        """Answer an agent's first line: Welcome (its beat token), or a refusal (None:
        close it)."""
        if not isinstance(hello, p.Hello):
            raise p.ProtocolError(f"expected hello, got {type(hello).__name__}")
        peer = _peer(transport)
        if not p.verify(self._token, "agent", nonce, hello.node, hello.proof):
            log.warning("agents: %s claims node %s with a wrong proof", peer, hello.node)
            return None
        refusal = self._handler.refuse(hello.node)
        if refusal is not None:
            log.warning(
                "agents: refused the agent of %s (pid %d): %s", hello.node, hello.pid, refusal
            )
            transport.write(p.encode(p.Shutdown(refusal)))
            return None
        proof = p.proof(self._token, "controller", hello.nonce, hello.node)
        token = secrets.token_hex(16)
        welcome = p.Welcome(
            proof=proof,
            heartbeat=self.heartbeat,
            beat_port=self.beat_port,
            beat_token=token,
            lease=self.lease,
        )
        transport.write(p.encode(welcome))
        return token

    def _connected(self, conn: Connection) -> None:
        self._unclaimed[conn.beat_token] = conn
        asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self._unbeaten, conn)
        self._handler.connected(conn)

    def _unbeaten(self, conn: Connection) -> None:
        if self._unclaimed.get(conn.beat_token) is conn:
            why = f"its agent opened no heartbeat connection within {HANDSHAKE_TIMEOUT:g}s"
            self._end(conn, why, silent=True)

    def _claim(self, token: str, beat: _Beat) -> Connection | None:
        """The admitted connection whose beat connection `beat` is (None: no such token)."""
        conn = self._unclaimed.pop(token, None)
        if conn is None or conn.gone:
            return None
        conn.beat = beat
        conn.last_seen = time.monotonic()
        self._conns[conn] = None  # from now on its silence counts
        return conn

    def _end(self, conn: Connection, why: str, *, silent: bool = False) -> None:
        self._conns.pop(conn, None)
        if self._unclaimed.get(conn.beat_token) is conn:
            del self._unclaimed[conn.beat_token]
        if conn.gone:
            return
        conn.gone = True
        conn.close(reset=silent)
        self._handler.gone(conn, why, silent=silent)

    async def _watch(self) -> None:
        period = min(WATCH, self.heartbeat / 2)
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            self._heard_beats(now)
            if now - last > 2 * period + 0.1:
                # We were not running: the agents' lines may be waiting unread. (The order
                # by last_seen holds: the oldest all become the same.)
                for conn in self._conns:
                    conn.last_seen = max(conn.last_seen, now - period)
            else:
                for conn in self.silent(now):
                    silence = now - conn.last_seen
                    self._end(conn, f"its agent was silent for {silence:.1f}s", silent=True)
            last = now

    def silent(self, now: float) -> list[Connection]:
        """The connections not heard from for longer than `silence` at `now`."""
        found = []
        for conn in self._conns:  # oldest-heard first: stop at the first one heard since
            if now - conn.last_seen <= self.silence:
                break
            found.append(conn)
        return found

    def _heard_beats(self, now: float) -> None:
        """Count every heartbeat that arrived since the last look as heard `now`."""
        conns = self._conns
        for beat, events in self.beats.arrived():
            conn = beat.conn
            if conn is None or conn.gone:
                continue
            if events & HANGUP:
                # Its agent went, or closes its session: the TLS connection reports that
                # (after a Bye, if it said one); a beat connection alone that dies leaves
                # its agent silent.
                beat.close()
                continue
            conn.last_seen = now
            conns.move_to_end(conn)
            conn.beats += 1
            if conn.beats % DRAIN_EVERY == 0:
                self.beats.drain(beat.fd)

    def heard(self, conn: Connection) -> None:
        """`conn` sent something just now."""
        conn.last_seen = time.monotonic()
        if conn in self._conns:  # not when its end is being reported
            self._conns.move_to_end(conn)


# Every connection reads into this one buffer: the loop fills it and hands it over in the
# same callback, and a plain protocol's read would allocate 256 KiB per heartbeat instead.
_RECEIVED = bytearray(64 * 1024)
_RECEIVED_VIEW = memoryview(_RECEIVED)


class _AgentProtocol(asyncio.BufferedProtocol):
    """One agent's connection: the handshake, then one message a line to the handler.

    A protocol, not a stream reader and a task: once admitted, a heartbeat costs one read in
    the server's batch and one call, no task wake-up, no allocation, no decode (`Cost` above)."""

    def __init__(self, server: AgentServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._tls: TlsBytes | None = None
        self._io: Transport | None = None  # what messages are written to: TLS, or the socket
        self._nonce = secrets.token_hex(16)
        self._timer: asyncio.TimerHandle | None = None
        self._fd = -1  # while the server's CoalescedReader reads it
        self._read_error: OSError | None = None
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        context = self._server.tls
        self._io = transport if context is None else TlsBytes(transport, context)
        self._tls = self._io if isinstance(self._io, TlsBytes) else None
        self._io.write(p.encode(p.Challenge(self._nonce)))  # TLS: sent after the handshake
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HANDSHAKE_TIMEOUT, self._refuse, "no hello in time")

    def get_buffer(self, sizehint: int) -> memoryview:
        return _RECEIVED_VIEW

    def buffer_updated(self, nbytes: int) -> None:
        if self._tls is not None:
            self._decrypted(nbytes)
            return
        if self.conn is not None:
            self._server.heard(self.conn)
        self.data_received(bytes(_RECEIVED_VIEW[:nbytes]))

    def _decrypted(self, nbytes: int) -> None:
        """`buffer_updated` over TLS: the same, on the plaintext of what arrived."""
        assert self._tls is not None
        try:
            data = self._tls.feed(_RECEIVED_VIEW[:nbytes])
        except ssl.SSLError as exc:
            if self.conn is not None:
                self._fail(f"TLS failed: {exc}")
            else:
                self._refuse(f"TLS failed: {exc}")
            return
        if self.conn is not None:
            self._server.heard(self.conn)
        if data:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None and not self._transport.is_closing():
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > p.MAX_LINE:
                    self._fail("its agent sent a line over the limit")
                return
            line = bytes(self._buffer[: end + 1])
            del self._buffer[: end + 1]
            self._line(line)

    def ended(self, exc: OSError | None) -> None:
        """The server's reader saw this connection end (or fail); asyncio reports it next."""
        self._fd = -1
        self._read_error = exc
        if self._transport is not None:
            if exc is None:
                self._transport.close()
            else:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._fd >= 0:
            self._server.reader.remove(self._fd)
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
        else:
            try:
                message = p.decode(line)
            except p.ProtocolError as exc:
                self._fail(f"its agent sent garbage: {exc}")
                return
            self._server._handler.received(conn, message)

    def _hello(self, line: bytes) -> None:
        assert self._transport is not None and self._io is not None
        if self._timer is not None:
            self._timer.cancel()
        try:
            hello = p.decode(line)
            token = self._server._admit(hello, self._io, self._nonce)
        except p.ProtocolError as exc:
            self._refuse(str(exc))
            return
        if token is None:
            self._transport.close()
            return
        assert isinstance(hello, p.Hello)
        self.conn = Connection(
            node=hello.node,
            pid=hello.pid,
            transport=self._io,
            live=list(hello.live),
            beat_token=token,
        )
        self._server._connected(self.conn)
        if not self._transport.is_closing():
            # From now on its lines are read in batches (`coalesced`), not one wake-up each.
            self._transport.pause_reading()
            self._fd = self._transport.get_extra_info("socket").fileno()
            self._server.reader.add(self._fd, self)

    def _refuse(self, why: str) -> None:
        if self._transport is not None:
            log.warning("agents: refused a connection from %s: %s", _peer(self._transport), why)
            self._transport.close()

    def _fail(self, why: str) -> None:
        if self.conn is not None:
            self._server._end(self.conn, why)
        elif self._transport is not None:
            self._transport.close()


class _Beat(asyncio.Protocol):
    """One agent's beat connection: its token line, then heartbeats the watcher only sees
    arrive (`beats`)."""

    def __init__(self, server: AgentServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._line = b""
        self._timer: asyncio.TimerHandle | None = None
        self.fd = -1  # while the server's `beats` watch it
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HANDSHAKE_TIMEOUT, self.close)

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._line += data
        end = self._line.find(b"\n")
        if end < 0:
            if len(self._line) > 64:
                self.close()
            return
        if self._timer is not None:
            self._timer.cancel()
        self.conn = self._server._claim(self._line[:end].decode(errors="replace"), self)
        if self.conn is None:
            log.warning("agents: a beat connection from %s with no session", _peer(self._transport))
            self.close()
            return
        self._transport.pause_reading()  # from now on its bytes are only seen arriving
        self.fd = self._transport.get_extra_info("socket").fileno()
        self._server.beats.add(self.fd, self)

    def close(self, *, reset: bool = False) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if reset:
            with contextlib.suppress(OSError):
                transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, _RESET
                )
            transport.abort()
        else:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.fd >= 0:
            self._server.beats.remove(self.fd)
            self.fd = -1


def _peer(transport: asyncio.BaseTransport | Transport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
