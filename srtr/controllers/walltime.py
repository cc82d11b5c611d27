"""Walltime: on SLURM, start the teardown early enough that every tier gets its grace before
the allocation's time limit kills the job whatever runs (KillWait after SIGTERM).

One key, `walltime`, queued once when the job starts: the first reconcile asks the backend
when the allocation ends (`JobStatus.end_time`), and each one after returns `requeue_after`
until the teardown is due, then begins it.
"""

from __future__ import annotations

import time

from srtr.controllers.context import Ctx
from srtr.controllers.job import begin_teardown
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import DesiredState

KEY = "walltime"
# Teardown starts this long before the allocation ends, on top of every tier's grace.
WALLTIME_MARGIN = 10.0


def teardown_budget(desired: DesiredState) -> float:
    """Seconds a graceful teardown may take: the longest grace of each tier, summed."""
    longest: dict[int, float] = {}
    for spec in desired.instances:
        tier = spec.shutdown_tier
        longest[tier] = max(longest.get(tier, 0.0), spec.stop_grace_seconds)
    return sum(longest.values())


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    job = store.job
    if job.walltime_budget is None:
        # Worked out once, for the job as it starts: tier graces + margin.
        job.walltime_budget = teardown_budget(store.desired) + WALLTIME_MARGIN
        if ctx.backend.capabilities.walltime:
            job.end_time = await ctx.backend.end_time()
        if job.end_time is None:
            return None
        store.record(
            "job",
            "Walltime",
            f"the allocation ends at {time.strftime('%H:%M:%S', time.localtime(job.end_time))}"
            f"; teardown starts {job.walltime_budget:.0f}s before (tier graces + margin)",
        )
    if job.end_time is None or job.teardown_requested:
        return None
    budget = job.walltime_budget
    delay = job.end_time - budget - ctx.clock.wall()
    if delay > 0:
        return Result(requeue_after=delay)
    holding = "benchmark" not in store.specs and not store.desired.terminal_services
    begin_teardown(
        ctx,
        exit_code=0 if holding else 1,
        reason=f"the allocation ends in {budget:.0f}s (time limit); walltime",
    )
    return None
