"""Time as the work queue and the controllers see it.

The work queue (`srtr.reconciler.workqueue`) and the controllers never call `time` or the
event loop directly; they take a `Clock`. Production code passes `MonotonicClock`, which runs
timers on the running asyncio loop. Tests pass `FakeClock`, which only moves when the test
calls `advance()`, so a backoff of sixty seconds costs no real time and timer order is exact.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "FakeClock", "MonotonicClock", "TimerHandle"]


class TimerHandle(Protocol):
    """What `Clock.call_at` returns; `asyncio.TimerHandle` satisfies it."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """A source of time plus a way to run a callback at a point in that time."""

    def now(self) -> float:
        """Monotonic seconds; the time base of `call_at`. Use for delays and deadlines."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch, like `time.time()`. Use only for timestamps shown to users."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once `now()` reaches `when` (a time already past means "soon")."""
        ...


class MonotonicClock:
    """The real clock: `now()` is the event loop's time and timers are `loop.call_at`.

    `loop.call_at` interprets its argument in `loop.time()`, so `now()` must use the same base
    or every delay would be off by an arbitrary offset. Inside a running loop we therefore read
    `loop.time()` itself; outside one we fall back to `time.monotonic()`, which is what the
    default asyncio loops use, so values taken before and after the loop starts still agree.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        # Usually None: the loop is looked up when needed, so the clock can be built before
        # `asyncio.run` creates one.
        self._loop = loop

    def _current_loop(self) -> asyncio.AbstractEventLoop | None:
        if self._loop is not None:
            return self._loop
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    def now(self) -> float:
        loop = self._current_loop()
        return loop.time() if loop is not None else time.monotonic()

    def wall(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        loop = self._current_loop()
        if loop is None:
            raise RuntimeError("MonotonicClock.call_at needs a running event loop or a bound loop")
        return loop.call_at(when, callback)


class _FakeTimer:
    """A FakeClock timer; cancelling only flags it, `advance` skips flagged ones."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when told to, running due timers synchronously.

    `now()` starts at 1000.0 rather than 0 so that code which wrongly treats 0 as "unset"
    shows up in tests. `wall()` is pinned to `now()` at a fixed epoch offset.
    """

    START = 1000.0
    WALL_AT_START = 1_700_000_000.0

    def __init__(self, start: float = START) -> None:
        self._now = start
        self._start = start
        # (when, sequence, timer): the sequence number keeps timers that share a due time in
        # the order they were scheduled and stops heapq from ever comparing two timers.
        self._heap: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self.WALL_AT_START + (self._now - self._start)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        timer = _FakeTimer(when, callback)
        heapq.heappush(self._heap, (when, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, running every timer that falls due, in time order.

        Timers that callbacks schedule inside the window also run in this call. While a
        callback runs, `now()` reads the timer's own due time, as it would on a real loop
        that woke up exactly on time; afterwards `now()` is the full target.
        """
        if seconds < 0:
            raise ValueError(f"time cannot go backwards (advance({seconds}))")
        target = self._now + seconds
        while self._heap and self._heap[0][0] <= target:
            when, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            # max(): a timer scheduled in the past runs now, without moving time backwards.
            self._now = max(self._now, when)
            timer.callback()
        self._now = target

    def pending(self) -> list[float]:
        """Due times of timers not yet run and not cancelled, ascending."""
        return sorted(when for when, _, timer in self._heap if not timer.cancelled)
