"""Read many agents' sockets in batches: one wake-up of the event loop per burst of lines.

Why: the heartbeats of 1,024 agents arrive spread over tens of milliseconds (the nodes'
clocks and paths differ a little; the hollow process writes them one after another), and a
loop that reads each socket as its line arrives wakes about 500 times a second. Those
wake-ups (a context switch and a loop iteration each), not the reads, were most of the
controller's idle CPU (benchmarks/README.md). As a network card moderates its interrupts, the
first line to arrive opens a short window, and every socket readable when it closes is read
in one go: a line from an agent waits at most `window` seconds longer than it would.

Except when the controller awaits an answer (`urgent()`: a launch or a probe asked of an
agent): then lines are read as they come, or launching 4,096 instances one after another
would pay a window per answer.

The sockets stay owned by their asyncio transports (which still write, and close them); only
their reading moves here. Level-triggered epoll: a socket with more than one buffer's worth
waiting is simply read again at the next batch.

Urgent data (the agents' doorbells) is not watched through that epoll: every arrival of
plain bytes wakes a socket's epoll waiters with EPOLLPRI among the events, so an epoll
watching for urgent data inside the loop's woke the loop's thread at every heartbeat. The
doorbells come by SIGURG to a thread of their own (`doorbells`), and a second epoll, for
urgent data only and outside the loop's, says which sockets rang (that thread polls it too,
for a while after each signal: an urgent byte can come after its signal). The first keeps their
hang-ups (an arrival's wake-up does not carry those, so it filters them out). Where the
kernel cannot direct SIGURG at a thread, the first epoll watches urgent data as before.

The loop stops watching the epoll for each window and watches it again after. Removed and
added back, the epoll would join the loop's anew each time, and the kernel's loop and path
checks on that join walk every socket inside (a fifth of an idle controller's CPU at 1,024
agents, five windows a second; ten times that at 10,000). So the epoll is also registered
for writing, which an epoll never is: taking its reading away and back is then a change of
its events (EPOLL_CTL_MOD), not a new join.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from collections.abc import Callable
from typing import Protocol

from srtr.backends.agent.doorbells import Doorbells

WINDOW = 0.004  # seconds a batch stays open after its first line arrived


class Sink(Protocol):
    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were read into the reader's buffer."""
        ...

    def ended(self, exc: OSError | None) -> None:
        """The socket reached its end (None: the peer closed it) or failed; it was removed."""
        ...


class CoalescedReader:
    """Reads the sockets added to it, a batch per `window`, into one shared buffer."""

    def __init__(
        self, buffer: bytearray, urgent: Callable[[], bool], *, window: float = WINDOW
    ) -> None:
        self._buffers = [buffer]
        self._urgent = urgent
        self._window = window
        self._epoll = select.epoll()
        self._urgent_epoll = select.epoll()  # the sockets that rang (`Doorbells`)
        self._bells: Doorbells | None = None  # None: urgent data is in `_epoll`
        self._no_bells = False  # the kernel could not direct SIGURG at a thread
        self._sinks: dict[int, Sink] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: asyncio.TimerHandle | None = None
        self.batches = 0  # windows read so far

    def add(self, fd: int, sink: Sink, events: int = select.EPOLLIN) -> None:
        """Read `fd` (a non-blocking socket) from now on, handing what arrives to `sink`;
        `events`: what wakes the reader for it (the agents' sockets: urgent data, a hang-up)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_writer(self._epoll.fileno(), _never)  # the MOD above
            self._loop.add_reader(self._epoll.fileno(), self._arrived)
        if events & select.EPOLLPRI and self._bells is None and not self._no_bells:
            bells = Doorbells(self._loop, self.ring, self._rang_unread)
            self._bells = bells if bells.start() else None
            self._no_bells = self._bells is None
        if events & select.EPOLLPRI and self._bells is not None and self._bells.own(fd):
            self._urgent_epoll.register(fd, select.EPOLLPRI)
            events &= ~select.EPOLLPRI
        self._epoll.register(fd, events)
        self._sinks[fd] = sink

    @property
    def watching(self) -> int:
        """How many sockets it reads."""
        return len(self._sinks)

    def remove(self, fd: int) -> None:
        """Stop reading `fd`; call before its socket is closed (the number may be reused)."""
        if self._sinks.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)
            with contextlib.suppress(OSError):
                self._urgent_epoll.unregister(fd)

    @property
    def bells(self) -> Doorbells | None:
        """The doorbells' thread, None where urgent data wakes the loop through its epoll."""
        return self._bells

    def close(self) -> None:
        if self._epoll.closed:
            return
        if self._batch is not None:
            self._batch.cancel()
            self._batch = None
        if self._loop is not None:
            self._loop.remove_reader(self._epoll.fileno())
            self._loop.remove_writer(self._epoll.fileno())
        if self._bells is not None:
            self._bells.close()
        self._sinks.clear()
        self._epoll.close()
        self._urgent_epoll.close()

    def _arrived(self) -> None:
        assert self._loop is not None
        if self._urgent():
            self._read()
            return
        self._loop.remove_reader(self._epoll.fileno())
        self._batch = self._loop.call_later(self._window, self._read_batch)

    def ring(self) -> None:
        """Some doorbell rang (which: `_urgent_epoll`, polled by the read this schedules)."""
        if self._loop is None or self._epoll.closed:
            return
        if self._urgent():
            self._read()
        elif self._batch is None:
            self._loop.remove_reader(self._epoll.fileno())
            self._batch = self._loop.call_later(self._window, self._read_batch)

    def _rang_unread(self) -> bool:
        """Whether some socket holds urgent data unread (the doorbells' thread asks: a byte
        can come after its signal, and its arrival signals nothing)."""
        return bool(self._urgent_epoll.poll(0, 1))

    def _read_batch(self) -> None:
        assert self._loop is not None
        self._batch = None
        self.batches += 1
        self._read()
        if not self._epoll.closed:  # a sink may have closed the server
            self._loop.add_reader(self._epoll.fileno(), self._arrived)

    def _read(self) -> None:
        """Read once from every socket with something to read."""
        most = max(1, len(self._sinks))
        ready = self._epoll.poll(0, most)
        if self._bells is not None:
            ready += self._urgent_epoll.poll(0, most)
        for fd, events in ready:
            if events & select.EPOLLPRI:
                self._past_mark(fd)
            else:
                self._read_one(fd)

    def _past_mark(self, fd: int) -> None:
        """Read a socket that rang up to its urgent byte's mark, where a read stops short,
        then once more, which passes it and so ends the urgency: a doorbell left unread
        would not ring again (its SIGURG came once), and in the loop's epoll it would wake
        the loop again."""
        self.drain(fd)
        self._read_one(fd)

    def drain(self, fd: int, most: int = 16) -> None:
        """Read `fd` until a read does not fill the buffer (`most` reads at most), outside
        any batch."""
        for _ in range(most):
            if not self._read_one(fd):
                return

    def _read_one(self, fd: int) -> bool:
        """One read of `fd` into its sink; whether it filled the buffer (more may wait: a
        read that stops short at an urgent byte's mark leaves the doorbell to the batches)."""
        sink = self._sinks.get(fd)
        if sink is None:
            return False
        try:
            nbytes = os.readv(fd, self._buffers)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self.remove(fd)
            sink.ended(exc)
            return False
        if nbytes == 0:
            self.remove(fd)
            sink.ended(None)
            return False
        sink.buffer_updated(nbytes)
        return nbytes == len(self._buffers[0])


def _never() -> None:
    """An epoll is never writable: its registration for writing only keeps it joined."""
