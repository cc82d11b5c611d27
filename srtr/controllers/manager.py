"""The manager: the controllers' table, handed to the reconcile loop (`reconciler/loop.py`).

The loop takes keys off the work queue and this module dispatches each to the controller
of its kind; backend observations, probe results, timers, saves of the recipe file and
intents only enqueue keys. Every timed decision (walltime, autoscaling, following a grow
request) is a key that returns `requeue_after`. Nothing polls: with nothing to do the loop
sleeps in `queue.get()`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from srtr.controllers import (
    autoscale,
    edits,
    exporter,
    fleet,
    gang,
    grow,
    instance,
    job,
    liveness,
    pool,
    probe,
    recipe,
    replacement,
    teardown,
    walltime,
)
from srtr.controllers.context import GROW, JOB, RECIPE, TEARDOWN, Ctx, pool_key
from srtr.reconciler import loop
from srtr.reconciler.workqueue import Result

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
    walltime.KEY: _whole(walltime.reconcile),
    RECIPE: _whole(recipe.reconcile),
    GROW: _whole(grow.reconcile),
    "scale": autoscale.reconcile,
}


async def dispatch(ctx: Ctx, key: str) -> Result | None:
    kind, _, name = key.partition("/")
    reconcile = RECONCILERS.get(kind)
    if reconcile is None:
        raise ValueError(f"unknown key {key!r}")
    return await reconcile(ctx, name)


async def process_one(ctx: Ctx, key: str) -> None:
    """Reconcile one key now, as the loop would (tests step the loop with it)."""
    await loop.reconcile_one(ctx.queue, key, lambda k: dispatch(ctx, k), ctx.on_reconciled)


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
    ctx.queue.add(walltime.KEY)
    for spec in ctx.store.desired.pools:
        ctx.queue.add(pool_key(spec.name))

    try:
        await loop.run_until(ctx.queue, lambda k: dispatch(ctx, k), ctx.done, ctx.on_reconciled)
    finally:
        for pending in list(ctx.tasks):
            pending.cancel()
        await _close(ctx)
    return ctx.store.job.exit_code or 0


async def _close(ctx: Ctx) -> None:
    """Close the backend; once its first step has asked the agents to end, the hooks of
    `Ctx.when_closing` run, while the agents end theirs."""
    closing = asyncio.ensure_future(ctx.backend.close())
    try:
        await asyncio.sleep(0)  # the close's first step runs first: it was scheduled first
        ctx.began_closing()
    finally:
        await closing
