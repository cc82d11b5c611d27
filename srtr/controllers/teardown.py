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
    tier = min(store.specs[n].shutdown_tier for n in alive)
    members = [n for n in alive if store.specs[n].shutdown_tier == tier]
    fresh = [n for n in members if store.status[n].stop_sent_at is None]
    if fresh:
        waiting = sorted({store.specs[n].stop_grace_seconds for n in fresh})
        store.record(
            "job",
            "TearingDown",
            f"tier {tier}: SIGTERM to {len(fresh)} instance(s), SIGKILL after "
            f"{', '.join(f'{g:g}s' for g in waiting)}",
        )
        for name in fresh:
            status = store.status[name]
            status.stop_sent_at = now
            status.phase = Phase.TERMINATING
            await ctx.backend.signal(name, signal.SIGTERM)
        store.changed()
    wake: float | None = None
    for name in members:
        status = store.status[name]
        if status.kill_sent or status.stop_sent_at is None:
            continue
        deadline = status.stop_sent_at + store.specs[name].stop_grace_seconds
        if now >= deadline:
            status.kill_sent = True
            await ctx.backend.signal(name, signal.SIGKILL)
            store.record(
                f"instance/{name}",
                "Killed",
                f"still running {store.specs[name].stop_grace_seconds:g}s after "
                "SIGTERM; sent SIGKILL",
                warning=True,
            )
        else:
            wake = deadline - now if wake is None else min(wake, deadline - now)
    return Result(requeue_after=wake) if wake is not None else None


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
