"""Teardown controller: stop the job tier by tier, SIGTERM first, SIGKILL after the grace.

Tiers go in ascending `shutdown_tier`; a tier is drained before the next one is signalled.
Within a tier every member gets SIGTERM at once. A second Ctrl+C (`kill_now`) sends SIGKILL
to everything still running.
"""

from __future__ import annotations

import signal

from srtr.controllers.context import Ctx
from srtr.reconciler.store import JobPhase, Phase
from srtr.reconciler.workqueue import Result


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    job = store.job
    if not job.teardown_requested or job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        return None
    alive = store.alive()
    now = ctx.clock.now()
    if job.kill_now:
        killed = [n for n in alive if not store.status[n].kill_sent]
        for name in killed:
            store.status[name].kill_sent = True
            await ctx.backend.signal(name, signal.SIGKILL)
        if killed:
            store.record(
                "job", "Killed", f"kill now: SIGKILL to {len(killed)} instance(s)", warning=True
            )
    if not alive:
        _finish(ctx)
        return None
    tier, members = lowest_tier(ctx, alive)
    fresh = [n for n in members if store.status[n].stop_sent_at is None]
    if fresh:
        waiting = sorted({store.specs[n].stop_grace_seconds for n in fresh})
        store.record(
            "job",
            "TearingDown",
            f"tier {tier}: SIGTERM to {len(fresh)} instance(s), SIGKILL after "
            f"{', '.join(f'{g:g}s' for g in waiting)}",
        )
    return await stop_all(ctx, members, now)


def lowest_tier(ctx: Ctx, names: list[str]) -> tuple[int, list[str]]:
    """The lowest shutdown tier among `names`, and its members: the ones to stop first."""
    tier = min(ctx.store.specs[n].shutdown_tier for n in names)
    return tier, [n for n in names if ctx.store.specs[n].shutdown_tier == tier]


async def stop_all(ctx: Ctx, names: list[str], now: float) -> Result | None:
    """One step of stopping each of `names`; requeue at the earliest grace deadline."""
    waits = [wait for name in names if (wait := await stop(ctx, name, now)) is not None]
    return Result(requeue_after=min(waits)) if waits else None


async def stop(ctx: Ctx, name: str, now: float) -> float | None:
    """SIGTERM once; SIGKILL once its `stop_grace_seconds` passed. Returns the seconds left
    until that deadline, or None when nothing is left to wait for.

    Shared by teardown, the removal of instances a live edit dropped, and user intents.
    """
    store = ctx.store
    status, spec = store.status[name], store.specs[name]
    if status.stop_sent_at is None:
        status.stop_sent_at = now
        status.phase = Phase.TERMINATING
        store.changed()
        await ctx.backend.signal(name, signal.SIGTERM)
    if status.kill_sent:
        return None
    deadline = status.stop_sent_at + spec.stop_grace_seconds
    if now < deadline:
        return deadline - now
    status.kill_sent = True
    await ctx.backend.signal(name, signal.SIGKILL)
    store.record(
        f"instance/{name}",
        "Killed",
        f"still running {spec.stop_grace_seconds:g}s after SIGTERM; sent SIGKILL",
        warning=True,
    )
    return None


def _finish(ctx: Ctx) -> None:
    store = ctx.store
    job = store.job
    for status in store.status.values():
        if status.phase in (Phase.PENDING, Phase.BACKOFF) and status.activated:
            status.phase = Phase.STOPPED
    code = job.exit_code or 0
    job.phase = JobPhase.SUCCEEDED if code == 0 else JobPhase.FAILED
    job.ended_at = ctx.clock.now()
    store.record(
        "job",
        "JobSucceeded" if code == 0 else "JobFailed",
        f"exit code {code}: {job.reason}",
        warning=code != 0,
    )
    ctx.done.set()
