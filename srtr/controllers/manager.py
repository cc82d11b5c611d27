"""The manager: wires the store, the queue, the backend and the controllers into one loop.

One asyncio task takes keys off the work queue and dispatches them to the controller of
their kind; backend observations, probe results, timers and intents only enqueue keys.
Nothing polls: with nothing to do the loop sleeps in `queue.get()`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable

from srtr.controllers import (
    edits,
    exporter,
    fleet,
    gang,
    instance,
    job,
    liveness,
    pool,
    probe,
    replacement,
    teardown,
)
from srtr.controllers.context import JOB, TEARDOWN, Ctx, pool_key
from srtr.reconciler.workqueue import QueueShutDown, Result, settle

log = logging.getLogger("srtr")


Reconcile = Callable[[Ctx, str], Awaitable[Result | None]]


def _whole(reconcile: Callable[[Ctx], Awaitable[Result | None]]) -> Reconcile:
    """A controller of one object (the job, the teardown): its key has no name part."""
    return lambda ctx, _name: reconcile(ctx)


# Key kind (the part before "/") → its controller's reconcile. A new controller is one line.
RECONCILERS: dict[str, Reconcile] = {
    JOB: _whole(job.reconcile),
    TEARDOWN: _whole(teardown.reconcile),
    "instance": instance.reconcile,
    "probe": probe.reconcile,
    "liveness": liveness.reconcile,
    "gang": gang.reconcile,
    "pool": pool.reconcile,
    "fleet": fleet.reconcile,
    replacement.KEY: _whole(replacement.reconcile),
    edits.REMOVAL: _whole(edits.reconcile_removal),
    exporter.KEY: _whole(exporter.reconcile),
}


async def dispatch(ctx: Ctx, key: str) -> Result | None:
    kind, _, name = key.partition("/")
    reconcile = RECONCILERS.get(kind)
    if reconcile is None:
        raise ValueError(f"unknown key {key!r}")
    return await reconcile(ctx, name)


async def process_one(ctx: Ctx, key: str) -> None:
    started = time.perf_counter()
    outcome: Result | BaseException | None
    try:
        outcome = await dispatch(ctx, key)
    except Exception as exc:  # a controller bug: log it, back off, keep the job alive
        log.exception("reconcile %s failed", key)
        outcome = exc
    if ctx.on_reconciled is not None:  # srtr's own metrics, when --metrics-port is on
        ctx.on_reconciled(key, time.perf_counter() - started, len(ctx.queue))
    settle(ctx.queue, key, outcome)


def request_stop(ctx: Ctx, signum: int) -> None:
    """Intent: stop the job because of signal `signum`; a second request kills everything."""
    store = ctx.store
    if store.job.teardown_requested:
        if signum in (signal.SIGHUP, signal.SIGPIPE):
            # Not a user's second Ctrl+C: a hang-up arrives from the shell, tmux and the
            # TUI's own loss detection alike (a closed stdout pipe likewise). The graceful
            # teardown goes on.
            return
        store.request_kill()
        ctx.queue.add(TEARDOWN)
        return
    name = signal.Signals(signum).name
    # No SIGPIPE is ever delivered (Python ignores it): the progress printer's EPIPE is.
    reason = "stdout closed (SIGPIPE)" if signum == signal.SIGPIPE else f"stopped by {name}"
    job.begin_teardown(ctx, exit_code=128 + signum, reason=reason)


async def run(ctx: Ctx) -> int:
    """Run the job to its end; return its exit code."""
    ctx.backend.set_listener(lambda obs: instance.observe(ctx, obs))
    ctx.queue.add(JOB)
    for spec in ctx.store.desired.pools:
        ctx.queue.add(pool_key(spec.name))

    async def worker() -> None:
        while True:
            try:
                key = await ctx.queue.get()
            except QueueShutDown:
                return
            await process_one(ctx, key)

    task = asyncio.create_task(worker())
    try:
        await ctx.done.wait()
    finally:
        ctx.queue.shutdown()
        await asyncio.wait({task}, timeout=5)
        for pending in list(ctx.tasks):
            pending.cancel()
        await ctx.backend.close()
    return ctx.store.job.exit_code or 0
