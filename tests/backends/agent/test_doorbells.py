"""The agents' doorbells reach the batch reader by SIGURG, taken by a thread of their own
(`doorbells`): not through the loop's epoll, not through asyncio's signal handling.

Real TCP sockets on loopback (socketpairs carry no urgent data), a real event loop."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from srtr.backends.agent.coalesced import CoalescedReader
from srtr.backends.agent.doorbells import Doorbells
from tests.backends.agent.test_coalesced import Sink
from tests.support.e2e_util import wait_for as blocking_wait_for
from tests.support.e2e_util import wait_for_async as wait_for

_BELL = select.EPOLLPRI | select.EPOLLRDHUP  # what the channel watches an agent's socket for


@contextmanager
def connections(n: int) -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    """(ours, theirs) TCP pairs; ours non-blocking."""
    lsock = socket.create_server(("127.0.0.1", 0), backlog=n)
    made = []
    try:
        for _ in range(n):
            theirs = socket.create_connection(lsock.getsockname())
            ours, _ = lsock.accept()
            ours.setblocking(False)
            made.append((ours, theirs))
        yield made
    finally:
        for a, b in made:
            a.close()
            b.close()
        lsock.close()


def _sigurg_blocked(pid: int | str = "self") -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("SigBlk:"))
    return bool(int(line.split()[1], 16) >> (signal.SIGURG - 1) & 1)


def _text(sink: Sink) -> bytes:
    return sink.received.replace(b"\x01", b"")


def test_a_doorbell_rings_by_sigurg_and_its_socket_is_read_in_a_batch() -> None:
    """Plain bytes (a heartbeat) wake nothing; the doorbell after a message does, and the
    bytes before it are read with it, in one batch; the socket's end still comes through
    the epoll."""

    async def main() -> None:
        buffer = bytearray(4096)
        reader = CoalescedReader(buffer, lambda: False, window=0.01)
        with connections(1) as [(ours, theirs)]:
            sink = Sink(buffer)
            try:
                reader.add(ours.fileno(), sink, _BELL)
                assert reader.bells is not None
                theirs.send(b"\x00" * 9)  # a heartbeat's size of plain bytes: no doorbell
                theirs.send(b"a message\n")
                theirs.send(b"\x01", socket.MSG_OOB)
                await wait_for(lambda: sink.received.endswith(b"a message\n"), within=10)
                assert sink.received == b"\x00" * 9 + b"a message\n"
                assert reader.batches == 1
                assert reader.bells.rings >= 1
                theirs.close()  # its end still wakes the loop, through the epoll
                await wait_for(lambda: sink.ends, within=10)
                assert sink.ends == [None]
            finally:
                reader.close()

    asyncio.run(main())


def test_only_the_doorbells_thread_blocks_sigurg_so_no_child_inherits_it() -> None:
    """A signal mask crosses fork and exec: the loop's thread, and so every process it
    starts, keeps SIGURG unblocked."""

    async def main() -> None:
        buffer = bytearray(4096)
        reader = CoalescedReader(buffer, lambda: False)
        with connections(1) as [(ours, _)]:
            try:
                reader.add(ours.fileno(), Sink(buffer), _BELL)
                assert reader.bells is not None
                assert not _sigurg_blocked()
                child = await asyncio.create_subprocess_exec(
                    "cat", "/proc/self/status", stdout=asyncio.subprocess.PIPE
                )
                out, _ = await child.communicate()
                line = next(x for x in out.decode().splitlines() if x.startswith("SigBlk:"))
                assert not int(line.split()[1], 16) >> (signal.SIGURG - 1) & 1
            finally:
                reader.close()

    asyncio.run(main())


def test_a_storm_of_doorbells_loses_no_sigterm_and_no_message() -> None:
    """Thousands of doorbells while the loop is busy (a launch's answers) hand the loop one
    wake-up at a time: asyncio's wakeup socket, which carries a SIGTERM to its handler,
    never fills (it did when asyncio took SIGURG itself: the SIGTERM's byte was lost).

    And every message is read, with no watcher's look to help: so many segments at once
    hold each sender back by its congestion window, and the segments it may send carry the
    urgent pointer of its newest doorbell, whose byte comes only after the receiver's
    delayed acknowledgement. The signal came with the pointer, and the byte's arrival
    signals nothing (without the doorbells' thread looking for it, 64 of 64 sockets stayed
    read up to an early point)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        terminated = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, terminated.set)
        buffer = bytearray(64 * 1024)
        reader = CoalescedReader(buffer, lambda: False, window=0.001)
        with connections(64) as made:
            sinks = [Sink(buffer) for _ in made]
            try:
                for (ours, _), sink in zip(made, sinks, strict=True):
                    reader.add(ours.fileno(), sink, _BELL)
                rounds = 60
                # The loop is busy (blocked) while every doorbell of the storm rings.
                for k in range(rounds):
                    for _, theirs in made:
                        theirs.send(b"m%d\n" % k)
                        theirs.send(b"\x01", socket.MSG_OOB)
                # The loop stays busy (blocked) until the doorbells' thread has handed it
                # its first wake-up, while more signals come.
                bells = reader.bells
                assert bells is not None
                blocking_wait_for(lambda: bells.rings >= 1, timeout=10)
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.wait_for(terminated.wait(), 10)
                want = b"".join(b"m%d\n" % k for k in range(rounds))
                # A second doorbell before the first was read puts the first in line.
                await wait_for(lambda: all(_text(s) == want for s in sinks), within=20)
                assert bells.rings < rounds * len(made)
            finally:
                reader.close()
                loop.remove_signal_handler(signal.SIGTERM)

    asyncio.run(main())


def test_urgent_data_found_unread_after_its_signal_rings_the_loop_again() -> None:
    """SIGURG comes with the urgent pointer, which can arrive ahead of its byte, and the
    byte's arrival signals nothing: for a while after a signal the doorbells' thread looks
    for urgent data unread (`pending`, the batch reader's urgent epoll), and rings the loop
    when it finds some."""

    async def main() -> None:
        unread = threading.Event()
        rung: list[bool] = []

        def ring() -> None:  # the loop's read: what was unread is read
            rung.append(unread.is_set())
            if len(rung) == 1:  # the byte comes just after the read, and signals nothing
                unread.set()
            else:
                unread.clear()

        bells = Doorbells(asyncio.get_running_loop(), ring, unread.is_set)
        with connections(1) as [(ours, theirs)]:
            try:
                assert bells.start()
                assert bells.own(ours.fileno())
                theirs.send(b"\x01", socket.MSG_OOB)  # the signal; its byte as if not come yet
                await wait_for(lambda: rung == [False, True], within=10)
                assert bells.caught >= 1
            finally:
                bells.close()

    asyncio.run(main())


def test_a_message_longer_than_the_buffer_is_read_whole_on_its_one_doorbell() -> None:
    """A doorbell rings once: its socket is read to the urgent mark and past it in that
    batch, however many buffers that takes (nothing would wake the loop for the rest)."""

    async def main() -> None:
        buffer = bytearray(4096)
        reader = CoalescedReader(buffer, lambda: False, window=0.001)
        with connections(1) as [(ours, theirs)]:
            sink = Sink(buffer)
            try:
                reader.add(ours.fileno(), sink, _BELL)
                message = b"x" * 20_000 + b"\n"
                theirs.sendall(message)
                theirs.send(b"\x01", socket.MSG_OOB)
                await wait_for(lambda: _text(sink) == message, within=10)
                theirs.send(b"a second\n")
                theirs.send(b"\x01", socket.MSG_OOB)  # rings again: the first one was passed
                await wait_for(lambda: _text(sink) == message + b"a second\n", within=10)
            finally:
                reader.close()

    asyncio.run(main())
