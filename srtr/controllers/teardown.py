"""Teardown controller: stop the job tier by tier, SIGTERM first, SIGKILL after the grace.

Tiers go in ascending `shutdown_tier`; a tier is drained before the next one is signalled.
The teardown begins once no launch is in flight (`context.Launches`), so that every
instance it stops has started.
Within a tier every member gets SIGTERM at once. A second Ctrl+C (`kill_now`) sends SIGKILL
to everything still running. The steps are decided by `teardown_decisions` (`teardown_step`,
`stop_step`); this module sends the signals and applies them through the store.
A teardown is looked at after every batch of exits; while no instance came alive since the
last full look (`Store.came_alive`), the next one goes over that look's tier alone.
"""

from __future__ import annotations

import signal

from srtr.controllers import teardown_decisions
from srtr.controllers.context import Ctx
from srtr.reconciler.workqueue import Result
from srtr.store.store import JobPhase


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    job = store.job
    if not job.teardown_requested or job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        return None
    if ctx.launches:
        # An instance whose launch is in flight may start any moment: signalling the others
        # first would stop its tier before it, and ending the job would leave it running.
        # Each answer queues the teardown again (`instance._await_launch`).
        return None
    now = ctx.clock.now()
    step = _step(ctx, kill_now=job.kill_now)
    for name in step.kill:
        store.killing(name)
        await ctx.backend.signal(name, signal.SIGKILL)
    if step.kill:
        store.record(
            "job", "Killed", f"kill now: SIGKILL to {len(step.kill)} instance(s)", warning=True
        )
    if step.finish:
        store.job_finished()
        ctx.done.set()
        return None
    if step.fresh:
        waiting = sorted({store.specs[n].stop_grace_seconds for n in step.fresh})
        store.record(
            "job",
            "TearingDown",
            f"tier {step.tier}: SIGTERM to {len(step.fresh)} instance(s), SIGKILL after "
            f"{', '.join(f'{g:g}s' for g in waiting)}",
        )
    return await stop_all(ctx, list(step.members), now)


def _step(ctx: Ctx, *, kill_now: bool) -> teardown_decisions.TeardownStep:
    """`teardown_step`; from the last one's members alone while no instance came alive since
    (the same step: `tier_step`), else from a pass over every instance."""
    store = ctx.store
    memo = ctx.teardown_memo
    fresh_memo = (
        memo is not None
        and memo.came_alive == store.came_alive
        and memo.generation == store.job.generation
    )
    if memo is not None and fresh_memo and not kill_now:
        step = teardown_decisions.tier_step(store.status, memo)
        if step is not None:
            memo.members = list(step.members)  # the next look goes over these only
            return step
    step = teardown_decisions.teardown_step(store.specs, store.status, kill_now=kill_now)
    ctx.teardown_memo = None
    if step.tier is not None:
        ctx.teardown_memo = teardown_decisions.TierMemo(
            store.came_alive, store.job.generation, step.tier, list(step.members)
        )
    return step


def lowest_tier(ctx: Ctx, names: list[str]) -> tuple[int, list[str]]:
    """The lowest shutdown tier among `names`, and its members: the ones to stop first."""
    return teardown_decisions.lowest_tier(ctx.store.specs, names)


async def stop_all(ctx: Ctx, names: list[str], now: float) -> Result | None:
    """One step of stopping each of `names`; requeue at the earliest grace deadline. Only
    the ones with a signal due take a step: a teardown is looked at again after every
    batch of exits, and nearly all of its members are then only waiting."""
    store = ctx.store
    due, deadline = teardown_decisions.stops_due(store.specs, store.status, names, now)
    waits = [wait for name in due if (wait := await stop(ctx, name, now)) is not None]
    if deadline is not None:
        waits.append(deadline - now)
    return Result(requeue_after=min(waits)) if waits else None


async def stop(ctx: Ctx, name: str, now: float) -> float | None:
    """SIGTERM once; SIGKILL once its `stop_grace_seconds` passed. Returns the seconds left
    until that deadline, or None when nothing is left to wait for.

    Shared by teardown, the removal of instances a live edit dropped, and user intents.
    """
    store = ctx.store
    spec = store.specs[name]
    step = teardown_decisions.stop_step(spec, store.status[name], now)
    if step.term:
        store.terminating(name, at=now)
        await ctx.backend.signal(name, signal.SIGTERM)
    if step.kill:
        store.killing(name)
        await ctx.backend.signal(name, signal.SIGKILL)
        store.record(
            f"instance/{name}",
            "Killed",
            f"still running {spec.stop_grace_seconds:g}s after SIGTERM; sent SIGKILL",
            warning=True,
        )
    return step.wait
