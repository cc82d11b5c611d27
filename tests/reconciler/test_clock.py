"""Tests for srtr.reconciler.clock: FakeClock ordering and MonotonicClock on a real loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from srtr.reconciler.clock import FakeClock, MonotonicClock

# Generous upper bound for real-loop waits; tests finish as soon as the event fires.
GUARD = 5.0


def test_fake_clock_start_and_wall_follow_now() -> None:
    clock = FakeClock()
    assert clock.now() == 1000.0
    assert clock.wall() == 1_700_000_000.0
    clock.advance(2.5)
    assert clock.now() == 1002.5
    assert clock.wall() == 1_700_000_002.5


def test_fake_clock_runs_due_timers_in_time_order_not_schedule_order() -> None:
    clock = FakeClock()
    ran: list[tuple[str, float]] = []
    clock.call_at(1003.0, lambda: ran.append(("c", clock.now())))
    clock.call_at(1001.0, lambda: ran.append(("a", clock.now())))
    clock.call_at(1002.0, lambda: ran.append(("b", clock.now())))
    clock.call_at(1002.0, lambda: ran.append(("b2", clock.now())))  # tie: schedule order
    clock.call_at(1010.0, lambda: ran.append(("late", clock.now())))

    clock.advance(0.5)
    assert ran == []
    assert clock.pending() == [1001.0, 1002.0, 1002.0, 1003.0, 1010.0]

    clock.advance(2.5)  # to 1003.0 inclusive
    # Each callback sees its own due time, as on a loop that woke exactly on time.
    assert ran == [("a", 1001.0), ("b", 1002.0), ("b2", 1002.0), ("c", 1003.0)]
    assert clock.now() == 1003.0
    assert clock.pending() == [1010.0]


def test_fake_clock_cancelled_timer_never_runs() -> None:
    clock = FakeClock()
    ran: list[str] = []
    handle = clock.call_at(1001.0, lambda: ran.append("cancelled"))
    clock.call_at(1002.0, lambda: ran.append("kept"))
    handle.cancel()
    assert clock.pending() == [1002.0]
    clock.advance(10)
    assert ran == ["kept"]
    assert clock.pending() == []


def test_fake_clock_timer_scheduled_by_callback_runs_in_same_advance() -> None:
    clock = FakeClock()
    ran: list[tuple[str, float]] = []

    def first() -> None:
        ran.append(("first", clock.now()))
        clock.call_at(clock.now() + 1, lambda: ran.append(("inside", clock.now())))
        clock.call_at(clock.now() + 5, lambda: ran.append(("outside", clock.now())))

    clock.call_at(1001.0, first)
    clock.advance(3)
    assert ran == [("first", 1001.0), ("inside", 1002.0)]
    assert clock.pending() == [1006.0]
    clock.advance(3)
    assert ran[-1] == ("outside", 1006.0)


def test_fake_clock_timer_in_the_past_runs_on_next_advance_without_rewinding() -> None:
    clock = FakeClock()
    ran: list[float] = []
    clock.call_at(900.0, lambda: ran.append(clock.now()))
    clock.advance(0)
    assert ran == [1000.0]


def test_fake_clock_refuses_to_go_backwards() -> None:
    with pytest.raises(ValueError):
        FakeClock().advance(-1)


def test_monotonic_clock_agrees_with_loop_time_and_wall_is_epoch() -> None:
    async def main() -> None:
        clock = MonotonicClock()
        loop = asyncio.get_running_loop()
        before = loop.time()
        now = clock.now()
        assert before <= now <= loop.time()
        assert abs(clock.wall() - time.time()) < GUARD

    asyncio.run(main())
    # Outside a loop it falls back to time.monotonic, the default loops' time base.
    before = time.monotonic()
    assert before <= MonotonicClock().now() <= time.monotonic()


def test_monotonic_clock_call_at_runs_callback_on_real_loop() -> None:
    async def main() -> None:
        clock = MonotonicClock()
        fired = asyncio.Event()
        when = clock.now() + 0.01
        clock.call_at(when, fired.set)
        await asyncio.wait_for(fired.wait(), GUARD)
        assert clock.now() >= when

    asyncio.run(main())


def test_monotonic_clock_cancelled_timer_does_not_run() -> None:
    async def main() -> None:
        clock = MonotonicClock()
        ran: list[str] = []
        later = asyncio.Event()
        handle = clock.call_at(clock.now() + 0.01, lambda: ran.append("cancelled"))
        # A later timer is the synchronisation point: once it ran, the cancelled one was due.
        clock.call_at(clock.now() + 0.02, later.set)
        handle.cancel()
        await asyncio.wait_for(later.wait(), GUARD)
        assert ran == []

    asyncio.run(main())


def test_monotonic_clock_call_at_without_loop_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        MonotonicClock().call_at(0.0, lambda: None)
