"""Fleet controller: poll a cluster's head until every member is alive.

The job controller enqueues `fleet/<stage>` once every member of a stage with a fleet gate is
ready. This controller opens the gate (its timeout counts from then), polls the head every
`interval_seconds` through the prober (a side task, so a slow dashboard never holds the
queue), and hands each answer to the store; the job controller judges the gate
(`fleet_decisions.fleet_gate`) and lets the stage pass once the store marks it passed.
"""

from __future__ import annotations

from srtr.controllers import fleet_decisions
from srtr.controllers.context import JOB, Ctx, fleet_key
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import Stage

# One poll's own timeout: a dashboard slower than this counts as no answer this round.
POLL_TIMEOUT = 5.0


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    stage = next((s for s in store.desired.stages if s.name == name), None)
    if stage is None or stage.fleet is None or store.job.teardown_requested:
        return None
    status = store.fleet(name)
    if status.passed or name in store.job.passed_stages or status.in_flight:
        return None
    if not fleet_decisions.members_ready(stage, store.status):
        return None  # the job controller's stage gate waits for them (or fails)
    if status.opened_at is None:
        store.fleet_opened(stage)
        ctx.queue.add(JOB)  # the gate's timeout is now the job's to watch
    now = ctx.clock.now()
    interval = stage.fleet.interval_seconds
    if status.polled_at is not None and now < status.polled_at + interval:
        return Result(requeue_after=status.polled_at + interval - now)
    store.fleet_poll_started(name)
    ctx.spawn(_poll(ctx, stage))
    return None


async def _poll(ctx: Ctx, stage: Stage) -> None:
    assert stage.fleet is not None
    fleet = stage.fleet
    try:
        alive, message = await ctx.prober.fleet(
            fleet.url, min(POLL_TIMEOUT, fleet.interval_seconds)
        )
    except Exception as exc:  # a prober bug must not wedge the gate "in flight"
        alive, message = None, f"poll error: {exc!r}"
    ctx.store.fleet_polled(stage, alive, message)
    ctx.queue.add(JOB)
    if not ctx.store.fleet(stage.name).passed:
        ctx.queue.add_after(fleet_key(stage.name), fleet.interval_seconds)
