"""The rate-limited, de-duplicating work queue that drives every controller, after client-go.

Watchers and event handlers call `add`/`add_after` with a key (usually a resource name); the
controller runtime's workers loop on `get()`, run `reconcile(key)` and hand the outcome to
`settle()`, which calls `done()` and decides whether and when the key comes back. The queue
guarantees that a key is queued at most once and that no two workers ever hold the same key:
a key added while it is being processed is parked and re-queued by `done()`.

Everything here runs on one event loop thread; nothing is thread-safe and nothing needs to be.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from srtr.reconciler.clock import Clock, TimerHandle

__all__ = ["QueueShutDown", "Result", "TransientError", "WorkQueue", "settle"]

K = TypeVar("K", bound=Hashable)

# Beyond this many failures base_delay * 2**n exceeds any sane max_delay anyway, and 2.0**1024
# would raise OverflowError, so the exponent is not computed past it.
_MAX_BACKOFF_EXPONENT = 64


class QueueShutDown(Exception):
    """Raised by `get()`/`get_nowait()` once `shutdown()` has been called."""


@dataclass(frozen=True)
class _Timer:
    when: float
    handle: TimerHandle


class WorkQueue(Generic[K]):
    """A FIFO of keys with de-duplication, delayed adds and per-key exponential backoff.

    A key is in at most one of two places that matter: queued (waiting for a worker) or
    processing (held by a worker). `_dirty` holds every key that needs a (further) reconcile;
    for a processing key it means "re-queue on done()".
    """

    def __init__(self, clock: Clock, base_delay: float = 0.005, max_delay: float = 60.0) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError(f"need 0 < base_delay <= max_delay, got {base_delay}, {max_delay}")
        self._clock = clock
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, _Timer] = {}
        self._failures: dict[K, int] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shut_down = False

    # --- adding -------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Mark `key` as needing a reconcile. Idempotent while the key is queued."""
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            # A worker holds the key; queueing it now would let a second worker reconcile it
            # concurrently. done() queues it instead.
            return
        self._queue.append(key)
        self._wake_waiters()

    def add_after(self, key: K, delay: float) -> None:
        """`add(key)` once `delay` seconds have passed; only the earliest pending time counts."""
        if self._shut_down:
            return
        if delay <= 0:
            # "Now" beats any pending timer, so by the earliest-wins rule that timer goes.
            self._cancel_timer(key)
            self.add(key)
            return
        when = self._clock.now() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending.when <= when:
                # Keep the earlier wake-up: a later request must never postpone a reconcile
                # someone already asked for sooner.
                return
            pending.handle.cancel()
        self._timers[key] = _Timer(when, self._clock.call_at(when, lambda: self._fire(key)))

    def add_rate_limited(self, key: K) -> None:
        """Re-add `key` after a backoff that doubles with each consecutive failure."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        if failures >= _MAX_BACKOFF_EXPONENT:
            delay = self._max_delay
        else:
            delay = min(self._base_delay * 2.0**failures, self._max_delay)
        self.add_after(key, delay)

    def forget(self, key: K) -> None:
        """Reset the backoff of `key` (after a success); does not cancel a pending timer."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How many times `add_rate_limited(key)` was called since the last `forget(key)`."""
        return self._failures.get(key, 0)

    # --- taking -------------------------------------------------------------------------------

    def get_nowait(self) -> K | None:
        """Take the oldest queued key and mark it processing, or return None if none is queued."""
        if self._shut_down:
            raise QueueShutDown
        if not self._queue:
            return None
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    async def get(self) -> K:
        """Wait for a queued key, take it in FIFO order and mark it processing."""
        while True:
            key = self.get_nowait()  # raises QueueShutDown once shut down
            if key is not None:
                return key
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                # Normally the waker already removed it; on cancellation we must, or add()
                # would later try to wake a dead future.
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def done(self, key: K) -> None:
        """End processing of `key`; if it was added meanwhile, queue it again."""
        if key not in self._processing:
            # Not ours to re-queue: if it is dirty it is already in the queue.
            return
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._queue.append(key)
            self._wake_waiters()

    # --- lifecycle and metrics ------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop handing out keys: `get()` waiters and later calls raise `QueueShutDown`.

        Queued keys are dropped rather than drained. Controllers are level-triggered, so a
        restarted controller relists everything and loses nothing that matters.
        """
        self._shut_down = True
        for timer in self._timers.values():
            timer.handle.cancel()
        self._timers.clear()
        self._wake_waiters()

    @property
    def shutting_down(self) -> bool:
        return self._shut_down

    def __len__(self) -> int:
        """Queued keys, not counting keys being processed: the queue depth metric."""
        return len(self._queue)

    # --- internals ----------------------------------------------------------------------------

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _cancel_timer(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.handle.cancel()

    def _wake_waiters(self) -> None:
        # Wake every waiter, not just one: each re-checks the queue, and a waiter cancelled
        # after being woken can then never swallow the only wake-up. Workers are few.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


# --- reconcile outcomes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """What a reconcile returns on success; `requeue_after` asks for another look later."""

    requeue_after: float | None = None

    def __post_init__(self) -> None:
        if self.requeue_after is not None and self.requeue_after < 0:
            raise ValueError(f"requeue_after must be >= 0, got {self.requeue_after}")


class TransientError(Exception):
    """An expected, retryable failure (a backend briefly unreachable, a conflict).

    `settle` backs it off exactly like any other exception; the distinction is for the caller,
    which logs it quietly instead of with a traceback.
    """


def settle(queue: WorkQueue[K], key: K, outcome: object) -> None:
    """Finish one reconcile of `key` on `queue` according to its outcome.

    Called by the controller worker after `reconcile(key)` returned or raised:

    - any `Exception` (`TransientError` included): retry with backoff (`add_rate_limited`);
    - `Result(requeue_after=t)`: success, reset backoff, look again in `t` seconds;
    - `None` or `Result()`: success, reset backoff, nothing scheduled.

    A `BaseException` that is not an `Exception` (cancellation, KeyboardInterrupt) re-queues
    the key without penalty and is re-raised: the work was not done, and cancellation must not
    be swallowed. Anything else is a bug in the reconciler: the key is backed off like an
    error so it is not lost, and `TypeError` is raised.
    """
    # done() first: add/add_after on a key still marked processing would only park it.
    queue.done(key)
    if isinstance(outcome, Exception):
        queue.add_rate_limited(key)
    elif isinstance(outcome, BaseException):
        queue.add(key)
        raise outcome
    elif outcome is None or isinstance(outcome, Result):
        queue.forget(key)
        if outcome is not None and outcome.requeue_after is not None:
            queue.add_after(key, outcome.requeue_after)
    else:
        queue.add_rate_limited(key)
        raise TypeError(f"reconcile must return Result or None, got {type(outcome).__name__}")
