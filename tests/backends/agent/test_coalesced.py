"""The controller reads its agents' sockets in batches (`coalesced`). (Its watcher's view of
them, who is silent: `test_beats`.)

Real sockets (socketpairs) on a real event loop; no clock is faked."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from srtr.backends.agent.coalesced import CoalescedReader
from tests.support.e2e_util import wait_for_async as wait_for


class Sink:
    def __init__(self, buffer: bytearray) -> None:
        self._buffer = buffer
        self.received = b""
        self.ends: list[OSError | None] = []

    def buffer_updated(self, nbytes: int) -> None:
        self.received += bytes(self._buffer[:nbytes])

    def ended(self, exc: OSError | None) -> None:
        self.ends.append(exc)


@contextmanager
def pairs(n: int) -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made = [socket.socketpair() for _ in range(n)]
    for ours, _ in made:
        ours.setblocking(False)
    try:
        yield made
    finally:
        for a, b in made:
            a.close()
            b.close()


def test_lines_that_arrive_together_are_read_in_one_batch() -> None:
    async def main() -> None:
        buffer = bytearray(4096)
        reader = CoalescedReader(buffer, lambda: False, window=0.05)
        with pairs(3) as made:
            sinks = [Sink(buffer) for _ in made]
            for (ours, _), sink in zip(made, sinks, strict=True):
                reader.add(ours.fileno(), sink)
            for k, (_, theirs) in enumerate(made):
                theirs.send(b'{"type":"heartbeat","running":%d}\n' % k)
            await wait_for(lambda: all(s.received for s in sinks), within=10)
            assert [s.received for s in sinks] == [
                b'{"type":"heartbeat","running":%d}\n' % k for k in range(3)
            ]
            assert reader.batches == 1  # one wake-up of the loop for the three of them
            made[0][1].send(b"again\n")
            await wait_for(lambda: sinks[0].received.endswith(b"again\n"), within=10)
            assert reader.batches == 2
            reader.close()

    asyncio.run(main())


def test_while_an_answer_is_awaited_lines_are_read_without_a_window() -> None:
    async def main() -> None:
        buffer = bytearray(4096)
        waiting = [True]
        # A window no test would wait out: the line can only come through the urgent path.
        reader = CoalescedReader(buffer, lambda: waiting[0], window=3600)
        with pairs(1) as [(ours, theirs)]:
            sink = Sink(buffer)
            reader.add(ours.fileno(), sink)
            theirs.send(b'{"type":"launched"}\n')
            await wait_for(lambda: sink.received == b'{"type":"launched"}\n', within=10)
            assert reader.batches == 0
            reader.close()

    asyncio.run(main())


def test_the_end_of_a_socket_and_a_reset_are_reported_once_and_it_is_forgotten() -> None:
    async def main() -> None:
        buffer = bytearray(4096)
        reader = CoalescedReader(buffer, lambda: False, window=0.01)
        closed, reset = Sink(buffer), Sink(buffer)
        a_ours, a_theirs = socket.socketpair()
        lsock = socket.create_server(("127.0.0.1", 0))
        b_theirs = socket.create_connection(lsock.getsockname())
        b_ours, _ = lsock.accept()
        try:
            for s in (a_ours, b_ours):
                s.setblocking(False)
            reader.add(a_ours.fileno(), closed)
            reader.add(b_ours.fileno(), reset)
            a_theirs.send(b"last words\n")
            a_theirs.close()
            # SO_LINGER 0: close sends a RST, as a peer's crashed kernel path would.
            b_theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            b_theirs.close()
            await wait_for(lambda: closed.ends and reset.ends, within=10)
            assert closed.received == b"last words\n"
            assert closed.ends == [None]
            assert len(reset.ends) == 1
            assert isinstance(reset.ends[0], ConnectionResetError)
            assert reader.watching == 0
        finally:
            reader.close()
            for s in (a_ours, b_ours, lsock):
                s.close()

    asyncio.run(main())
