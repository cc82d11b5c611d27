"""Walltime: on SLURM, start the teardown early enough that every tier gets its grace before
the allocation's time limit kills the job whatever runs (KillWait after SIGTERM)."""

from __future__ import annotations

import asyncio
import time

from srtr.controllers.context import Ctx
from srtr.controllers.job import begin_teardown
from srtr.resources.objects import DesiredState

# Teardown starts this long before the allocation ends, on top of every tier's grace.
WALLTIME_MARGIN = 10.0


def teardown_budget(desired: DesiredState) -> float:
    """Seconds a graceful teardown may take: the longest grace of each tier, summed."""
    longest: dict[int, float] = {}
    for spec in desired.instances:
        tier = spec.shutdown_tier
        longest[tier] = max(longest.get(tier, 0.0), spec.stop_grace_seconds)
    return sum(longest.values())


class Walltime:
    """A side task (see `side_tasks`): the timer that starts the walltime teardown."""

    name = "walltime"

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.timer: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        end_time = await _end_time(self.ctx)
        if end_time is None:
            return
        ctx = self.ctx
        budget = teardown_budget(ctx.store.desired) + WALLTIME_MARGIN
        delay = max(0.0, end_time - budget - ctx.clock.wall())
        self.timer = asyncio.get_running_loop().call_later(delay, self._fire, budget)
        ctx.store.extensions["end_time"] = end_time
        ctx.store.record(
            "job",
            "Walltime",
            f"the allocation ends at {time.strftime('%H:%M:%S', time.localtime(end_time))}"
            f"; teardown starts {budget:.0f}s before (tier graces + margin)",
        )

    async def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _fire(self, budget: float) -> None:
        ctx = self.ctx
        if ctx.store.job.teardown_requested:
            return
        holding = "benchmark" not in ctx.store.specs and not ctx.store.desired.terminal_services
        begin_teardown(
            ctx,
            exit_code=0 if holding else 1,
            reason=f"the allocation ends in {budget:.0f}s (time limit); walltime",
        )


async def _end_time(ctx: Ctx) -> float | None:
    backend = ctx.backend
    return await backend.end_time() if backend.capabilities.walltime else None
