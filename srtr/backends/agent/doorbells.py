"""The agents' doorbells by SIGURG, taken by one thread of their own.

Why not an epoll: every arrival of plain bytes on a socket wakes its epoll waiters with
EPOLLPRI among the events (the kernel's `sock_def_readable`), so an urgent-only epoll inside
the event loop's woke the loop's thread in the kernel at every heartbeat, to find nothing:
most of an idle controller's CPU at 10,000 agents. The kernel signals urgent data itself:
SIGURG to the socket's owner (`F_SETOWN_EX`), sent only when a new urgent pointer arrives.

Why not asyncio's signal handler: each signal it takes writes a byte to the loop's wakeup
socket, which a launch's thousands of doorbells a second filled. A SIGTERM or SIGINT whose
byte finds it full is lost (asyncio acts on the byte only). So the sockets are owned by ONE
thread (`F_OWNER_TID`: the signal goes to that thread, never to another), which alone
blocks SIGURG and takes it with `sigwait`; it hands the loop one wake-up
(`call_soon_threadsafe`) and then waits until the loop took it, while further SIGURGs
merge into one pending signal. So at most one byte of ours is ever in the loop's wakeup
socket, and asyncio's handlers of SIGTERM and SIGINT are untouched.

No other thread blocks SIGURG, so no child inherits it blocked (a signal mask crosses fork
and exec; Go's runtime, for one, preempts with SIGURG): every process srtr starts is started
from the loop's thread or a thread it made, never from this one.

The signal comes with the urgent pointer, which can arrive well ahead of its byte: a sender
held back by its congestion window sends the bytes it may, and each carries the pointer of
the newest doorbell it holds. The loop's read then finds no urgent data (EPOLLPRI only counts
a byte that came), and the byte's arrival signals nothing (the pointer is not new). Nothing
but a poll sees it, and an epoll left waiting would wake at every heartbeat; so for `WATCH`
seconds after each signal the thread polls once every `STEP` for urgent data unread
(`pending`), and hands the loop a wake-up when it finds some.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable

# fcntl's Linux values, which the module does not export: the owner is a thread (its tid).
F_SETOWN_EX = 15
F_OWNER_TID = 0
_URG = {signal.SIGURG}
# After a signal, how long and how often to look for urgent bytes that came after it: a
# sender's congestion window opens within an acknowledgement's delay (40 ms here) or a
# round trip; later than `WATCH` the silence watcher's look finds them (`beats.rang`).
WATCH = 0.25
STEP = 0.01


class Doorbells:
    """A thread that takes SIGURG for the sockets it `own`s and calls `ring` in the loop:
    one call per wake-up, none while the last one has not run yet (`ring` must poll for the
    urgent sockets after it was called, so it finds every doorbell whose signal merged);
    also when `pending` finds urgent data unread within `WATCH` of a signal."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ring: Callable[[], None],
        pending: Callable[[], bool] = lambda: False,
    ) -> None:
        self._loop = loop
        self._ring = ring
        self._pending = pending  # whether some socket holds urgent data unread (any thread)
        self._tid = 0
        self._ready = threading.Event()
        self._taken = threading.Lock()  # the thread's until the loop runs its wake-up
        self._closed = False
        self._thread = threading.Thread(target=self._wait, name="srtr-doorbells", daemon=True)
        self.rings = 0  # wake-ups handed to the loop so far
        self.caught = 0  # of them, for urgent data found unread after its signal

    def start(self) -> bool:
        """Start the thread; False where the kernel cannot direct SIGURG at it (not Linux) or
        no thread starts: urgent data then wakes the loop through its epoll."""
        if not sys.platform.startswith("linux"):
            return False
        try:
            self._thread.start()
        except RuntimeError:  # a process at its limit of threads
            return False
        self._ready.wait()
        return self._tid > 0

    def own(self, fd: int) -> bool:
        """Direct `fd`'s SIGURG to the thread; False if the kernel refused."""
        try:
            fcntl.fcntl(fd, F_SETOWN_EX, struct.pack("ii", F_OWNER_TID, self._tid))
        except OSError:
            return False
        return True

    def close(self) -> None:
        """End the thread (it may still be waiting for its signal, or for the loop)."""
        if self._closed or not self._thread.is_alive():
            self._closed = True
            return
        self._closed = True
        # The signal first: the thread ends only once it sees `_closed` after a wake-up, and
        # the release below may be that wake-up (a signal to an ended thread is undefined).
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_kill(self._thread.ident or 0, signal.SIGURG)
        with contextlib.suppress(RuntimeError):  # (held: by the thread, or for a wake-up)
            self._taken.release()

    def _wait(self) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _URG)  # this thread's mask only
            self._tid = threading.get_native_id()
        finally:
            self._ready.set()
        until = 0.0  # looking for urgent bytes that came after their signal until then
        signalled = False  # the last wake-up was for a signal
        while True:
            self._taken.acquire()  # the last wake-up has run: the loop's read polled after it
            if signalled:
                until = time.monotonic() + WATCH
            signalled = self._next(until)
            if self._closed:
                return
            self.rings += 1
            if not signalled:
                self.caught += 1
            try:
                self._loop.call_soon_threadsafe(self._rang)
            except RuntimeError:  # the loop is closed
                return

    def _next(self, until: float) -> bool:
        """Wait for a reason to wake the loop: True for a signal, False for urgent data found
        unread before `until` (or the thread closing)."""
        while time.monotonic() < until:
            if signal.sigtimedwait(_URG, STEP) is not None:
                return True
            if self._closed or self._unread():
                return False
        signal.sigwait(_URG)
        return True

    def _unread(self) -> bool:
        try:
            return self._pending()
        except (OSError, ValueError):  # its epoll closed meanwhile
            return False

    def _rang(self) -> None:
        with contextlib.suppress(RuntimeError):  # released by close meanwhile
            self._taken.release()
        if not self._closed:
            self._ring()
