"""How the node agent reaches its controller: the TLS connection (retried while the
controller starts; heartbeats and messages both travel on it), and the run dir's rendezvous
file, where a controller that adopts the job says where it listens.

Standard library and `srtr.net.tls` (stdlib `ssl` and `hashlib`) only, as the node agent it is
part of.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import socket
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from srtr.backends.agent import frames
from srtr.backends.agent import protocol as p
from srtr.net import tls

HANDSHAKE_TIMEOUT = 30.0
_SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in a socket's send queue not sent yet
_FOUR = bytes(4)  # the ioctl's answer's room


class Wire:
    """What the agent writes besides its messages, on its one connection (`frames`): the
    heartbeat frames, between the stream's records, and the doorbell after each message.

    Both go to the socket's own transport, under TLS: asyncio encrypts what the agent writes
    at once and hands the record to that transport, so a frame written there after it
    follows the record whole. When TLS still holds bytes back (its transport paused), a
    heartbeat goes as a line of the stream instead, and a doorbell waits for the next
    message or heartbeat (the controller reads every connection every few heartbeats)."""

    def __init__(self, writer: asyncio.StreamWriter, key: str) -> None:
        self._writer = writer
        self._key = bytes.fromhex(key) if key else b""
        self._sent = 0  # heartbeat frames so far
        transport: Any = writer.transport
        # The socket's transport under asyncio's TLS one (3.11+: no public accessor).
        self._raw: Any = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
        if self._raw is None and writer.get_extra_info("ssl_object") is None:
            self._raw = transport  # in the clear, the stream's transport is the socket's
        self._owed = False  # a doorbell that could not go yet
        self.doubted = False  # the last doorbell went behind bytes not sent yet

    def _clear(self) -> bool:
        """Whether a frame written now follows everything written before it whole."""
        raw = self._raw
        return (
            raw is not None
            and not raw.is_closing()
            and not self._writer.is_closing()
            and (
                self._writer.transport is raw or not self._writer.transport.get_write_buffer_size()
            )
        )

    def beat(self) -> None:
        """One heartbeat; before it, the last doorbell again if it went behind bytes not sent
        yet and they are all sent now: its signal may have come before its byte, whose
        arrival signals nothing, and a doorbell with nothing before it comes with its byte."""
        if self.doubted and _unsent(self._raw) == 0:
            self.ring()
        if not self._key or not self._clear():
            self._writer.write(p.BEAT)
        else:
            self._raw.write(frames.beat(self._key, self._sent))
            self._sent += 1
        if self._owed:
            self.ring()

    def ring(self) -> None:
        """The doorbell: one byte of TCP urgent data, once what was written reached the
        kernel (an urgent byte jumps any bytes a transport still holds)."""
        self._owed = not self._key or not self._clear() or self._raw.get_write_buffer_size() > 0
        if self._owed:
            return
        with contextlib.suppress(OSError, AttributeError):  # a socket closing meanwhile
            fd = self._raw.get_extra_info("socket").fileno()
            # Bytes not sent yet before it: the segments they go in carry its urgent pointer,
            # and so its signal, before the byte itself can go (a congestion window full).
            self.doubted = _queued(fd) > 0
            sock = socket.socket(fileno=fd)  # a view of the transport's socket, never closed
            try:
                sock.send(bytes((frames.BELL,)), socket.MSG_OOB)
            finally:
                sock.detach()


def _unsent(transport: Any) -> int:
    """Bytes written to `transport`'s socket that its kernel has not sent yet (-1: unknown)."""
    try:
        return _queued(transport.get_extra_info("socket").fileno())
    except (OSError, AttributeError, ValueError):
        return -1


def _queued(fd: int) -> int:
    """`_unsent` of the socket `fd`."""
    try:
        answer = fcntl.ioctl(fd, _SIOCOUTQNSD, _FOUR)
    except (OSError, ValueError):
        return -1
    return int.from_bytes(answer, sys.byteorder, signed=True)


def read_rendezvous(path: Path) -> tuple[str, int] | None:
    """The HOST:PORT a controller wrote into the run dir's rendezvous file, if any."""
    try:
        host, _, port = path.read_text().strip().rpartition(":")
        return host.strip("[]"), int(port)
    except (OSError, ValueError):
        return None


async def connect(
    host: str, port: int, within: float, *, tls: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect, retrying refusals (the controller may still be starting) for `within` s.
    `tls`: speak TLS (the caller pins the certificate before it sends anything)."""
    deadline = time.monotonic() + within
    delay = 0.05
    context = _client_context() if tls else None
    while True:
        try:
            return await asyncio.open_connection(
                host,
                port,
                limit=p.MAX_LINE,
                ssl=context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT if context is not None else None,
            )
        except OSError:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)


@functools.lru_cache(maxsize=1)
def _client_context() -> ssl.SSLContext:
    """One context for every connection (hollow mode: a thousand agents in one process)."""
    return tls.client_context()
