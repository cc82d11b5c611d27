"""The controller's end of the agents' connections: accept, authenticate, watch heartbeats.

`AgentServer` listens on one TCP port of the controller's machine (an ephemeral port on the
address the nodes route to; 127.0.0.1 locally). Each connection must prove it holds the job's
token (`protocol`: challenge, HMAC proof, counter-proof) and name a node of the allocation
that has no live agent yet; anything else is closed. Once accepted, every message goes to the
`Handler`, and the connection's end, or a silence longer than `silence` seconds, is reported
once through `Handler.gone`.

A stalled event loop (a long state.json write under load) must not read as silent agents:
the watcher only counts silence while it runs on time itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from srtr.backends.agent import protocol as p

log = logging.getLogger("srtr")

HEARTBEAT = 0.5  # how often agents send one
SILENCE = 2.0  # an agent not heard from for this long is gone
HANDSHAKE_TIMEOUT = 10.0


@dataclass(eq=False)
class Connection:
    """One authenticated agent."""

    node: str
    pid: int
    writer: asyncio.StreamWriter
    last_seen: float = field(default_factory=time.monotonic)
    gone: bool = False
    # [name, attempt, pid, start] of the attempts the agent kept through a controller crash.
    live: list[list[Any]] = field(default_factory=list)

    def send(self, message: p.Message) -> None:
        """Queue `message`; a connection that is closing drops it (its end is reported)."""
        if self.gone or self.writer.is_closing():
            return
        with contextlib.suppress(OSError):
            self.writer.write(p.encode(message))

    def close(self) -> None:
        self.writer.close()


class Handler(Protocol):
    def connected(self, conn: Connection) -> None: ...

    def received(self, conn: Connection, message: p.Message) -> None: ...

    def gone(self, conn: Connection, why: str) -> None: ...

    def refuse(self, node: str) -> str | None:
        """Why an agent of `node` may not connect now, or None when it may."""
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
    ) -> None:
        self._token = token
        self._handler = handler
        self.heartbeat = heartbeat
        self.silence = silence
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()
        self._watcher: asyncio.Task[None] | None = None
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on an ephemeral port of `host`; return the (host, port) agents dial."""
        self._server = await asyncio.start_server(self._serve, host, 0, limit=p.MAX_LINE)
        sock = self._server.sockets[0]
        self.address = (host, int(sock.getsockname()[1]))
        self._watcher = asyncio.create_task(self._watch())
        return self.address

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
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            conn = await asyncio.wait_for(self._admit(reader, writer), HANDSHAKE_TIMEOUT)
        except (p.ProtocolError, TimeoutError, OSError, ValueError) as exc:
            log.warning("agents: refused a connection from %s: %s", _peer(writer), exc)
            conn = None
        if conn is None:
            writer.close()
            return
        self._conns.add(conn)
        self._handler.connected(conn)
        why = await self._read(conn, reader)
        self._end(conn, why)

    async def _admit(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Connection | None:
        nonce = secrets.token_hex(16)
        writer.write(p.encode(p.Challenge(nonce)))
        hello = p.decode(await reader.readline())
        if not isinstance(hello, p.Hello):
            raise p.ProtocolError(f"expected hello, got {type(hello).__name__}")
        if not p.verify(self._token, "agent", nonce, hello.node, hello.proof):
            log.warning("agents: %s claims node %s with a wrong proof", _peer(writer), hello.node)
            return None
        refusal = self._handler.refuse(hello.node)
        if refusal is not None:
            log.warning(
                "agents: refused the agent of %s (pid %d): %s", hello.node, hello.pid, refusal
            )
            writer.write(p.encode(p.Shutdown(refusal)))
            return None
        proof = p.proof(self._token, "controller", hello.nonce, hello.node)
        writer.write(p.encode(p.Welcome(proof=proof, heartbeat=self.heartbeat)))
        return Connection(node=hello.node, pid=hello.pid, writer=writer, live=list(hello.live))

    async def _read(self, conn: Connection, reader: asyncio.StreamReader) -> str:
        while True:
            try:
                line = await reader.readline()
            except (OSError, ValueError) as exc:
                return f"its connection broke: {exc}"
            if not line:
                return "its agent closed the connection"
            conn.last_seen = time.monotonic()
            try:
                message = p.decode(line)
            except p.ProtocolError as exc:
                return f"its agent sent garbage: {exc}"
            self._handler.received(conn, message)

    def _end(self, conn: Connection, why: str) -> None:
        self._conns.discard(conn)
        if conn.gone:
            return
        conn.gone = True
        conn.close()
        self._handler.gone(conn, why)

    async def _watch(self) -> None:
        period = self.heartbeat / 2
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            late = now - last > 2 * period + 0.1
            last = now
            for conn in list(self._conns):
                if late:
                    # We were not running: the agents' lines may be waiting unread.
                    conn.last_seen = max(conn.last_seen, now - period)
                elif now - conn.last_seen > self.silence:
                    self._end(conn, f"its agent was silent for {now - conn.last_seen:.1f}s")


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
