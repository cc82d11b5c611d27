"""The agent's doorbell goes again when it went behind bytes its kernel had not sent yet:
the segments those bytes go in carry its urgent pointer, and so its SIGURG, before its byte,
and the byte's arrival signals nothing. Real TCP on loopback, a real event loop."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from srtr.backends.agent import frames
from srtr.backends.agent.dial import Wire, _unsent
from tests.support.e2e_util import wait_for_async as wait_for

_BULK = 64 * 1024  # its kernel takes it all; a 4 KiB receive buffer takes only some


@asynccontextmanager
async def _wired() -> AsyncIterator[tuple[socket.socket, asyncio.StreamWriter, bytes, Wire]]:
    """(the receiving socket, urgent data inline, not read yet; the sender's writer; its
    heartbeat key; its `Wire`), closed after."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited by the accepted
    _, writer = await asyncio.open_connection(*lsock.getsockname())
    ours, _ = lsock.accept()
    lsock.close()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
    ours.setblocking(False)
    key = secrets.token_bytes(frames.KEY)
    try:
        yield ours, writer, key, Wire(writer, key.hex())
    finally:
        writer.close()
        ours.close()


def _read_all(sock: socket.socket, into: bytearray) -> None:
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            return
        into += chunk


def test_a_doorbell_behind_unsent_bytes_rings_again_once_they_are_sent() -> None:
    async def main() -> None:
        async with _wired() as (ours, writer, key, wire):
            received = bytearray()
            writer.write(b"x" * _BULK)
            await wait_for(lambda: writer.transport.get_write_buffer_size() == 0, 10, "kernel")
            assert _unsent(writer.transport) > 0  # the receiver reads nothing yet
            wire.ring()
            assert wire.doubted
            wire.beat()  # still unsent: no second doorbell yet
            assert wire.doubted

            def drained() -> bool:
                _read_all(ours, received)
                return _unsent(writer.transport) == 0

            await wait_for(drained, 10, "everything sent")
            wire.beat()
            assert not wire.doubted
            await wait_for(
                lambda: (_read_all(ours, received), len(received))[1] >= _BULK + 12,
                10,
                "the doorbells and heartbeats",
            )
            bell = bytes((frames.BELL,))
            beat0, beat1 = frames.beat(key, 0), frames.beat(key, 1)
            # The first doorbell, the first heartbeat (it went while bytes were unsent), then
            # the second doorbell before the second heartbeat.
            assert bytes(received[_BULK:]) == bell + beat0 + bell + beat1

    asyncio.run(main())


def test_a_doorbell_with_nothing_unsent_before_it_rings_once() -> None:
    async def main() -> None:
        async with _wired() as (ours, writer, key, wire):
            received = bytearray()
            writer.write(b"a message\n")
            await wait_for(lambda: _unsent(writer.transport) == 0, 10, "sent")
            wire.ring()
            assert not wire.doubted
            wire.beat()
            await wait_for(lambda: (_read_all(ours, received), len(received))[1] >= 20, 10, "all")
            assert bytes(received) == b"a message\n" + bytes((frames.BELL,)) + frames.beat(key, 0)

    asyncio.run(main())
