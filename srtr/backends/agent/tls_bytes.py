"""TLS on the controller's end of the agent channel, as bytes in and bytes out.

Why not asyncio's own TLS (`create_server(ssl=...)`): the controller reads its agents'
sockets itself, in batches, from their raw fds (`coalesced`: one wake-up of the loop for a
burst of 1,024 heartbeats instead of one each, the idle-CPU target). asyncio's TLS transport
owns its socket's reads, so it cannot be read that way. Here the socket stays a plain
transport whose raw bytes (read by asyncio before admission, by the batch reader after) are
fed to an `ssl.SSLObject` over two `ssl.MemoryBIO`s; what it decrypts goes to the channel's
line parser, and what the channel writes is encrypted on its way to the transport.

`TlsBytes` is the transport the channel's protocol and `Connection` write to, in place of
the plain one: the protocol (messages, proofs, heartbeats, a lease's keepalives) is the same
over both. One decrypt per heartbeat record is the price; `read` is called once per record
and asks for more only when the BIO or the SSL object still holds bytes, so a heartbeat
costs no exception.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, cast

# A TLS record holds at most 16 KiB of plaintext. Reads go into one buffer shared by every
# session (the loop runs one feed at a time): `read(n)` without a buffer allocates n bytes
# per call, and at 256 KiB that was an mmap + munmap per heartbeat (76 µs instead of 4).
_RECORD = 16 * 1024
_PLAIN = bytearray(_RECORD)
_PLAIN_VIEW = memoryview(_PLAIN)


class TlsBytes:
    """The server side of a TLS session over an asyncio transport's raw bytes."""

    def __init__(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        self.raw = transport
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_side=True)
        self._ready = False
        self._queued: list[bytes] = []  # written before the handshake completed

    @property
    def ready(self) -> bool:
        """The handshake is complete: application bytes flow."""
        return self._ready

    def feed(self, data: bytes | memoryview) -> bytes:
        """Raw bytes from the peer in; the plaintext they complete out (maybe b"").

        Raises:
            ssl.SSLError: the peer does not speak TLS, or failed the handshake.
        """
        self._in.write(data)
        if not self._ready:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return b""
            self._ready = True
            self._flush()
            for chunk in self._queued:
                self.write(chunk)
            self._queued.clear()
        out = []
        while self._in.pending or self._ssl.pending():
            try:
                # With a buffer, read returns a count (typeshed says bytes).
                nbytes = cast(int, self._ssl.read(_RECORD, _PLAIN))
            except ssl.SSLWantReadError:  # a record not yet whole
                break
            except ssl.SSLZeroReturnError:  # close_notify: the transport's end follows
                break
            if not nbytes:
                break
            out.append(bytes(_PLAIN_VIEW[:nbytes]))
        if self._out.pending:  # a read may answer (a key update)
            self._flush()
        return out[0] if len(out) == 1 else b"".join(out)

    def write(self, data: bytes) -> None:
        """Encrypt `data` to the transport (queued until the handshake completes)."""
        if not self._ready:
            self._queued.append(bytes(data))
            return
        self._ssl.write(data)
        self._flush()

    def _flush(self) -> None:
        if self._out.pending:
            self.raw.write(self._out.read())

    # -- the rest of a transport, as the channel uses it -----------------------------------

    def is_closing(self) -> bool:
        return self.raw.is_closing()

    def close(self) -> None:
        self.raw.close()

    def abort(self) -> None:
        self.raw.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        return self.raw.get_extra_info(name, default)
