"""Tests for srtr.reconciler.workqueue: de-duplication, delays, backoff, get(), settle()."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from srtr.reconciler.clock import FakeClock, MonotonicClock
from srtr.reconciler.workqueue import (
    QueueShutDown,
    Result,
    TransientError,
    WorkQueue,
    settle,
)

# Generous upper bound for real-loop waits; tests finish as soon as the awaited thing happens.
GUARD = 5.0


def make(base: float = 1.0, max_delay: float = 8.0) -> tuple[WorkQueue[str], FakeClock]:
    clock = FakeClock()
    return WorkQueue[str](clock, base_delay=base, max_delay=max_delay), clock


# --- de-duplication and order -------------------------------------------------------------------


def test_add_twice_is_queued_once() -> None:
    q, _ = make()
    q.add("a")
    q.add("a")
    assert len(q) == 1
    assert q.get_nowait() == "a"
    assert len(q) == 0
    assert q.get_nowait() is None


def test_add_during_processing_waits_for_done_and_is_returned_once() -> None:
    q, _ = make()
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    q.add("a")
    # Never hand a key to a second worker while the first still holds it.
    assert q.get_nowait() is None
    assert len(q) == 0
    q.done("a")
    assert len(q) == 1
    assert q.get_nowait() == "a"
    q.done("a")
    assert q.get_nowait() is None


def test_done_without_readd_does_not_requeue() -> None:
    q, _ = make()
    q.add("a")
    assert q.get_nowait() == "a"
    q.done("a")
    assert len(q) == 0
    q.done("a")  # a stray second done must not conjure the key back
    assert q.get_nowait() is None


def test_done_on_a_queued_key_does_not_duplicate_it() -> None:
    q, _ = make()
    q.add("a")
    q.done("a")  # nobody holds "a"; it is already queued
    assert len(q) == 1
    assert q.get_nowait() == "a"
    assert q.get_nowait() is None


def test_fifo_across_keys() -> None:
    q, _ = make()
    for key in ["c", "a", "b", "a", "c"]:
        q.add(key)
    assert [q.get_nowait() for _ in range(4)] == ["c", "a", "b", None]


def test_key_readded_during_processing_goes_to_the_back() -> None:
    q, _ = make()
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    q.add("b")
    q.done("a")
    assert [q.get_nowait(), q.get_nowait()] == ["b", "a"]


# --- add_after ----------------------------------------------------------------------------------


def test_add_after_not_ready_before_delay_ready_after() -> None:
    q, clock = make()
    q.add_after("a", 5)
    assert clock.pending() == [1005.0]
    clock.advance(4.9)
    assert len(q) == 0
    assert q.get_nowait() is None
    clock.advance(0.1)
    assert q.get_nowait() == "a"
    assert clock.pending() == []


def test_add_after_earlier_request_replaces_later_timer() -> None:
    q, clock = make()
    q.add_after("a", 10)
    q.add_after("a", 3)
    assert clock.pending() == [1003.0]  # the 10s timer was cancelled, not just shadowed
    clock.advance(3)
    assert q.get_nowait() == "a"
    q.done("a")
    clock.advance(100)
    assert q.get_nowait() is None


def test_add_after_later_request_does_not_postpone_earlier_timer() -> None:
    q, clock = make()
    q.add_after("a", 3)
    q.add_after("a", 10)
    q.add_after("a", 3)  # equal time keeps the existing timer
    assert clock.pending() == [1003.0]
    clock.advance(3)
    assert q.get_nowait() == "a"


def test_add_after_zero_adds_now_and_drops_pending_timer() -> None:
    q, clock = make()
    q.add_after("a", 10)
    q.add_after("a", 0)
    assert q.get_nowait() == "a"
    assert clock.pending() == []


def test_add_after_timers_are_per_key() -> None:
    q, clock = make()
    q.add_after("a", 2)
    q.add_after("b", 1)
    assert clock.pending() == [1001.0, 1002.0]
    clock.advance(2)
    assert [q.get_nowait(), q.get_nowait()] == ["b", "a"]


# --- backoff ------------------------------------------------------------------------------------


def test_rate_limited_backoff_doubles_caps_and_forget_resets() -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    for n, expected in enumerate([1, 2, 4, 8, 8]):
        assert q.failures("a") == n
        q.add_rate_limited("a")
        assert clock.pending() == [clock.now() + expected]
        clock.advance(expected - 0.5)
        assert q.get_nowait() is None
        clock.advance(0.5)
        assert q.get_nowait() == "a"
        q.done("a")
    assert q.failures("a") == 5
    q.forget("a")
    assert q.failures("a") == 0
    q.add_rate_limited("a")
    assert clock.pending() == [clock.now() + 1]


def test_backoff_is_per_key() -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    for _ in range(3):
        q.add_rate_limited("a")
    q.add_rate_limited("b")
    assert q.failures("a") == 3
    assert q.failures("b") == 1
    assert clock.pending() == [1001.0, 1001.0]  # "a" kept its first (earliest) timer


def test_backoff_with_many_failures_stays_at_max_without_overflow() -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    for _ in range(2000):
        q.add_rate_limited("a")
        clock.advance(8)
        assert q.get_nowait() == "a"
        q.done("a")
    q.add_rate_limited("a")
    assert clock.pending() == [clock.now() + 8]


def test_default_delays_are_client_go_like() -> None:
    clock = FakeClock()
    q = WorkQueue[str](clock)
    q.add_rate_limited("a")
    assert clock.pending() == [pytest.approx(1000.005)]


@pytest.mark.parametrize(("base", "max_delay"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_invalid_delays_rejected(base: float, max_delay: float) -> None:
    with pytest.raises(ValueError):
        WorkQueue[str](FakeClock(), base_delay=base, max_delay=max_delay)


# --- async get and shutdown ---------------------------------------------------------------------


def test_get_returns_immediately_when_something_is_queued() -> None:
    async def main() -> None:
        q = WorkQueue[str](MonotonicClock())
        q.add("a")
        assert await asyncio.wait_for(q.get(), GUARD) == "a"

    asyncio.run(main())


def test_get_wakes_when_another_task_adds() -> None:
    async def main() -> None:
        q = WorkQueue[str](MonotonicClock())
        getter = asyncio.create_task(q.get())
        await asyncio.sleep(0)  # let the getter block (a yield, not a wait)
        assert not getter.done()

        async def producer() -> None:
            q.add("a")

        await asyncio.create_task(producer())
        assert await asyncio.wait_for(getter, GUARD) == "a"

    asyncio.run(main())


def test_get_wakes_on_real_timer_from_add_after() -> None:
    async def main() -> None:
        q = WorkQueue[str](MonotonicClock())
        q.add_after("a", 0.01)
        assert await asyncio.wait_for(q.get(), GUARD) == "a"

    asyncio.run(main())


def test_two_waiters_each_get_one_key() -> None:
    async def main() -> None:
        q = WorkQueue[str](MonotonicClock())
        getters = [asyncio.create_task(q.get()) for _ in range(2)]
        await asyncio.sleep(0)
        q.add("a")
        q.add("b")
        got = await asyncio.wait_for(asyncio.gather(*getters), GUARD)
        assert sorted(got) == ["a", "b"]

    asyncio.run(main())


def test_cancelled_get_does_not_lose_the_key() -> None:
    async def main() -> None:
        q = WorkQueue[str](MonotonicClock())
        getter = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        getter.cancel()
        q.add("a")  # woken just as it is cancelled
        with pytest.raises(asyncio.CancelledError):
            await getter
        assert await asyncio.wait_for(q.get(), GUARD) == "a"

    asyncio.run(main())


def test_shutdown_wakes_waiters_with_queue_shut_down() -> None:
    async def main() -> None:
        q = WorkQueue[str](MonotonicClock())
        getters = [asyncio.create_task(q.get()) for _ in range(2)]
        await asyncio.sleep(0)
        assert not any(g.done() for g in getters)
        q.shutdown()
        results = await asyncio.wait_for(asyncio.gather(*getters, return_exceptions=True), GUARD)
        assert all(isinstance(r, QueueShutDown) for r in results)
        with pytest.raises(QueueShutDown):
            await q.get()
        assert q.shutting_down

    asyncio.run(main())


def test_shutdown_cancels_timers_and_ignores_later_adds() -> None:
    q, clock = make()
    q.add_after("a", 5)
    q.shutdown()
    assert clock.pending() == []
    q.add("b")
    q.add_after("c", 1)
    assert len(q) == 0
    assert clock.pending() == []
    with pytest.raises(QueueShutDown):
        q.get_nowait()


# --- settle -------------------------------------------------------------------------------------


def processing(q: WorkQueue[str], key: str) -> None:
    """Put `key` into the processing state, as a worker's get() would."""
    q.add(key)
    assert q.get_nowait() == key


@pytest.mark.parametrize("error", [TransientError("later"), ValueError("bug")])
def test_settle_exception_backs_off(error: Exception) -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    processing(q, "a")
    settle(q, "a", error)
    assert q.failures("a") == 1
    assert clock.pending() == [1001.0]
    assert q.get_nowait() is None
    clock.advance(1)
    assert q.get_nowait() == "a"  # only possible because settle called done()
    settle(q, "a", error)
    assert clock.pending() == [1003.0]  # second failure: 2 s


def test_settle_requeue_after_forgets_then_schedules() -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    processing(q, "a")
    settle(q, "a", TransientError())
    clock.advance(1)
    assert q.get_nowait() == "a"
    settle(q, "a", Result(requeue_after=30))
    assert q.failures("a") == 0
    assert clock.pending() == [1031.0]
    clock.advance(30)
    assert q.get_nowait() == "a"


@pytest.mark.parametrize("outcome", [None, Result()])
def test_settle_success_forgets_and_schedules_nothing(outcome: Result | None) -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    q.add_rate_limited("a")
    q.add_rate_limited("a")
    clock.advance(1)
    assert q.get_nowait() == "a"
    settle(q, "a", outcome)
    assert q.failures("a") == 0
    assert clock.pending() == []
    assert len(q) == 0
    q.add("a")
    assert q.get_nowait() == "a"  # done() was called: the key is not stuck in processing


def test_settle_calls_done_so_a_readd_during_reconcile_is_requeued() -> None:
    q, _ = make()
    processing(q, "a")
    q.add("a")  # an event arrived while reconciling
    settle(q, "a", None)
    assert q.get_nowait() == "a"


def test_settle_cancellation_requeues_without_penalty_and_reraises() -> None:
    q, clock = make()
    processing(q, "a")
    with pytest.raises(asyncio.CancelledError):
        settle(q, "a", asyncio.CancelledError())
    assert q.failures("a") == 0
    assert clock.pending() == []
    assert q.get_nowait() == "a"


def test_settle_rejects_unknown_outcome_but_keeps_the_key() -> None:
    q, clock = make(base=1.0, max_delay=8.0)
    processing(q, "a")
    with pytest.raises(TypeError):
        settle(q, "a", "ok")  # type: ignore[arg-type]
    assert clock.pending() == [1001.0]


def test_result_rejects_negative_requeue() -> None:
    with pytest.raises(ValueError):
        Result(requeue_after=-1)


# --- property: never two holders, never a lost key ----------------------------------------------

KEYS = st.sampled_from(["a", "b", "c", "d"])


class QueueMachine(RuleBasedStateMachine):
    """Drives a queue with random adds, delayed adds, gets, dones and clock advances.

    Model: `owed` is the set of keys added (or whose timer fired) since they were last handed
    out; each must be handed out again. `held` is the set of keys a worker holds.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.q = WorkQueue[str](self.clock, base_delay=1.0, max_delay=8.0)
        self.owed: set[str] = set()
        self.held: set[str] = set()
        self.timers: dict[str, float] = {}

    def _fire_due(self) -> None:
        for key, when in list(self.timers.items()):
            if when <= self.clock.now():
                del self.timers[key]
                self.owed.add(key)

    def _take(self) -> str | None:
        key = self.q.get_nowait()
        if key is not None:
            assert key not in self.held, f"{key} handed out while being processed"
            assert key in self.owed, f"{key} handed out without being added"
            self.owed.discard(key)
            self.held.add(key)
        return key

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        self.q.add(key)
        self.owed.add(key)

    @rule(key=KEYS, delay=st.integers(min_value=0, max_value=5))
    def add_after(self, key: str, delay: int) -> None:
        self.q.add_after(key, delay)
        if delay == 0:
            self.timers.pop(key, None)
            self.owed.add(key)
        else:
            when = self.clock.now() + delay
            self.timers[key] = min(self.timers.get(key, when), when)

    @rule(seconds=st.integers(min_value=0, max_value=5))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self._fire_due()

    @rule()
    def get(self) -> None:
        key = self._take()
        if key is None:
            assert not (self.owed - self.held), "a queued key was not handed out"

    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        if self.held:
            key = data.draw(st.sampled_from(sorted(self.held)))
            self.q.done(key)
            self.held.discard(key)

    @rule(key=KEYS)
    def stray_done(self, key: str) -> None:
        # done() on a key nobody holds (a buggy worker) must change nothing.
        if key not in self.held:
            self.q.done(key)

    @invariant()
    def depth_matches_model(self) -> None:
        # Queued = owed and not held; owed-and-held keys are parked until done().
        assert len(self.q) == len(self.owed - self.held)
        assert self.clock.pending() == sorted(self.timers.values())

    def teardown(self) -> None:
        # Drain: finish every held key, fire every timer, then take until empty.
        for key in sorted(self.held):
            self.q.done(key)
        self.held.clear()
        self.clock.advance(10)
        self._fire_due()
        while (key := self._take()) is not None:
            self.q.done(key)
            self.held.discard(key)
        assert not self.owed, f"keys lost: {sorted(self.owed)}"


QueueMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_queue_never_double_hands_out_or_loses_keys = QueueMachine.TestCase
