"""The controller reads its agents' sockets in batches (`coalesced`). (Its watcher's view of
them, who is silent: `test_beats`.)

Real sockets (socketpairs) on a real event loop; no clock is faked."""

from __future__ import annotations

import asyncio
import select
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


def test_a_doorbell_rings_by_sigurg_and_its_socket_is_read_in_a_batch() -> None:
    """An agent's socket is watched for urgent data (its doorbell) and its end only: the
    doorbell reaches the loop as SIGURG (the kernel's signal to the socket's owner), not
    through the loop's epoll, which every arrival of plain bytes would wake in the kernel.
    The bytes before the doorbell are read with it, in one batch."""

    async def main() -> None:
        buffer = bytearray(4096)
        reader = CoalescedReader(buffer, lambda: False, window=0.01)
        lsock = socket.create_server(("127.0.0.1", 0))
        theirs = socket.create_connection(lsock.getsockname())
        ours, _ = lsock.accept()
        ours.setblocking(False)
        sink = Sink(buffer)
        try:
            reader.add(ours.fileno(), sink, select.EPOLLPRI | select.EPOLLRDHUP)
            assert reader._signalled  # asyncio.run's loop is in the main thread
            theirs.send(b"\x00" * 9)  # a heartbeat's size of plain bytes: no doorbell
            theirs.send(b"a message\n")
            theirs.send(b"\x01", socket.MSG_OOB)
            await wait_for(lambda: sink.received.endswith(b"a message\n"), within=10)
            assert sink.received == b"\x00" * 9 + b"a message\n"
            assert reader.batches == 1
            theirs.close()  # its end still wakes the loop, through the epoll
            await wait_for(lambda: sink.ends, within=10)
            assert sink.ends == [None]
        finally:
            reader.close()
            for s in (ours, theirs, lsock):
                s.close()

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
