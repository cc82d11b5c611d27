"""Gang controller: a pool whose owner has `restart.scope: pool` restarts as a whole.

A static rendezvous (torchrun, JAX, NCCL) cannot take one relaunched rank back: when any
member of such a pool fails (a non-zero exit or a signal srtr did not send, a failed
liveness probe, a failed launch, a lost node), every member is stopped (SIGTERM, its grace,
SIGKILL) and, after the backoff, the whole pool relaunches in pool order. `max_restarts`
pool restarts within `window_seconds`, then the pool is Failed. Riders keep running.

Key `gang/<pool>`. The instance controller hands a member's exit here (`on_exit`); the
decisions are `health_decisions.gang_exit`, `gang_lost` and `gang_delay`.
"""

from __future__ import annotations

from srtr.controllers import health_decisions, teardown
from srtr.controllers.context import JOB, Ctx, gang_key, instance_key, pool_key
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceSpec
from srtr.store.store import Phase


def on_exit(ctx: Ctx, spec: InstanceSpec) -> bool:
    """The attempt of a member of a gang-scoped pool ended: True when the pool decides what
    follows (the instance is held for its relaunch, or failed with it), False when the
    instance's own rules do (a clean exit, a user's stop or restart, a teardown)."""
    store = ctx.store
    if not health_decisions.gang_scoped(spec) or store.job.teardown_requested:
        return False
    assert spec.pool is not None
    status = store.status[spec.name]
    gang = store.gangs.get(spec.pool)
    verdict = health_decisions.gang_exit(spec, status, gang, now=ctx.clock.now())
    return _apply(ctx, spec, verdict)


def on_lost(ctx: Ctx, spec: InstanceSpec) -> None:
    """A member was lost with its node: its pool restarts (a replacement, if any, comes
    from the replacement controller)."""
    if not health_decisions.gang_scoped(spec) or ctx.store.job.teardown_requested:
        return
    assert spec.pool is not None
    gang = ctx.store.gangs.get(spec.pool)
    _apply(ctx, spec, health_decisions.gang_lost(spec, gang, now=ctx.clock.now()))


def _apply(ctx: Ctx, spec: InstanceSpec, verdict: health_decisions.GangVerdict) -> bool:
    store = ctx.store
    assert spec.pool is not None
    gang = store.gangs.get(spec.pool)
    match verdict:
        case health_decisions.Ordinary():
            return False
        case health_decisions.Hold():
            if gang is not None and gang.failed:
                store.finished(spec.name, Phase.STOPPED)  # the pool failed: it ends here
            else:
                store.gang_hold(spec.name)
        case health_decisions.RestartPool(why=why, window_start=start):
            policy = spec.restart
            store.gang_begin(
                spec.pool,
                first=spec.name,
                why=why,
                limit=policy.max_restarts,
                window=policy.window_seconds,
                window_start=start,
            )
        case health_decisions.FailPool(why=why, code=code):
            store.gang_gave_up(
                spec.pool, first=spec.name, why=why, code=code, limit=spec.restart.max_restarts
            )
            if store.status[spec.name].exited:
                store.finished(spec.name, Phase.FAILED)
            ctx.queue.add(JOB)  # a terminal or critical pool fails the job
    ctx.queue.add(gang_key(spec.pool))
    ctx.queue.add(pool_key(spec.pool))
    return True


async def reconcile(ctx: Ctx, pool: str) -> Result | None:
    store = ctx.store
    gang = store.gangs.get(pool)
    if gang is None:
        return None
    members = [n for n in store.instances_of_pool(pool) if n not in store.removing]
    if store.job.teardown_requested:
        for name in health_decisions.held_members(members, store.status):
            ctx.queue.add(instance_key(name))  # no timer of theirs will: they end Stopped
        return None
    now = ctx.clock.now()
    if gang.stopping:
        if any(n in ctx.launches for n in members):
            return None  # it may start any moment, and must be stopped too: its answer queues us
        alive = [n for n in members if store.status[n].alive and store.status[n].gang_held]
        if alive:
            return await teardown.stop_all(ctx, alive, now)
        if gang.failed or any(store.status[n].exited for n in members):
            return None  # the instance controller holds (or ends) the exited ones first
        spec = store.specs[members[0]]
        delay = health_decisions.gang_delay(spec, gang, ctx.jitter())
        store.gang_backing_off(pool, start_at=now + delay, delay=delay)
        return Result(requeue_after=delay)
    if gang.next_start_at is None:
        return None
    if now < gang.next_start_at:
        return Result(requeue_after=gang.next_start_at - now)
    held = health_decisions.held_members(members, store.status)
    store.gang_relaunch(pool, held)
    for name in held:  # queued in pool order: launched in pool order
        ctx.queue.add(instance_key(name))
    return None
