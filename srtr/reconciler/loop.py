"""The reconcile loop: one worker takes keys off the work queue and reconciles them in turn.

The loop knows keys, not controllers: the caller hands it `dispatch`, which finds the
reconcile of a key's kind (`controllers/manager.py` holds that table). What a reconcile
returns, or raises, goes back to the queue through `settle`: a requeue, a backoff, or done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from srtr.reconciler.workqueue import QueueShutDown, Result, WorkQueue, settle

log = logging.getLogger("srtr")

Dispatch = Callable[[str], Awaitable[Result | None]]
# Told after every reconcile: key, seconds it took, keys still queued (srtr's own metrics).
OnReconciled = Callable[[str, float, int], None]


async def reconcile_one(
    queue: WorkQueue[str], key: str, dispatch: Dispatch, on_reconciled: OnReconciled | None = None
) -> None:
    started = time.perf_counter()
    outcome: Result | BaseException | None
    try:
        outcome = await dispatch(key)
    except Exception as exc:  # a controller bug: log it, back off, keep the job alive
        log.exception("reconcile %s failed", key)
        outcome = exc
    if on_reconciled is not None:
        on_reconciled(key, time.perf_counter() - started, len(queue))
    settle(queue, key, outcome)


async def run_until(
    queue: WorkQueue[str],
    dispatch: Dispatch,
    done: asyncio.Event,
    on_reconciled: OnReconciled | None = None,
) -> None:
    """Reconcile keys, one at a time, until `done` is set; then shut the queue down.

    With nothing to do the worker sleeps in `queue.get()`: nothing polls.
    """

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            await reconcile_one(queue, key, dispatch, on_reconciled)

    task = asyncio.create_task(worker())
    try:
        await done.wait()
    finally:
        queue.shutdown()
        await asyncio.wait({task}, timeout=5)
