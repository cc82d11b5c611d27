"""Live recipe edits: apply a Plan to the store, and stop what an edit removed, tier by tier.

`apply` only rewrites desired state and marks intents (restart, remove); the instance, job
and removal controllers converge. The removal controller stops dropped instances the way
teardown stops a job: lowest tier first, SIGTERM, SIGKILL after the grace, next tier when the
previous one is gone; then their records leave the store.
"""

from __future__ import annotations

from srtr.controllers import exporter, teardown
from srtr.controllers.context import JOB, Ctx, instance_key, liveness_key, pool_key
from srtr.reconciler.workqueue import Result
from srtr.resources.diff import Plan
from srtr.resources.objects import DesiredState

REMOVAL = "removal"


def propose(ctx: Ctx, new: DesiredState, plan: Plan, text: str, *, auto: bool) -> None:
    """A valid edit arrived: apply it now (auto), or hold it for the user's yes (confirm)."""
    if plan.refused:
        reject(ctx, [f"refused live: {reason}" for reason in plan.refused], plan)
        return
    if plan.empty:
        ctx.store.recipe_unchanged(text)  # e.g. only comments changed: nothing to roll out
        return
    if auto:
        apply(ctx, new, plan, text)
        return
    ctx.store.hold_plan(new, plan, text)


def reject(ctx: Ctx, lines: list[str], plan: Plan | None = None) -> None:
    """Record a refused edit; nothing running is touched."""
    ctx.store.reject_plan(lines, plan)


def apply_pending(ctx: Ctx) -> str:
    new, plan, text = ctx.store.take_pending()
    return apply(ctx, new, plan, text)


def discard_pending(ctx: Ctx) -> str:
    ctx.store.discard_pending()
    return "discarded"


def apply(ctx: Ctx, new: DesiredState, plan: Plan, text: str = "") -> str:
    """Make `new` the desired state; returns the event message. The plan must be applicable."""
    store = ctx.store
    store.apply_edit(new, plan, text, launching=ctx.launches.names)
    for change in (*plan.add, *plan.restart):
        ctx.queue.add(instance_key(change.name))
    for change in plan.hot:  # a liveness probe added or changed live starts watching now
        ctx.queue.add(liveness_key(change.name))
    exporter.desired_changed(ctx)  # skip instances whose binary is missing; re-list targets
    for pool in new.pools:
        ctx.queue.add(pool_key(pool.name))
    message = f"generation {store.job.generation}: {plan.summary()}"
    details = [f"+{c.name}" for c in plan.add] + [f"-{c.name}" for c in plan.remove]
    details += [f"~{c.name}" for c in plan.restart]
    if details:
        shown = details[:20]
        more = f" (+{len(details) - 20} more)" if len(details) > 20 else ""
        message += f" [{' '.join(shown)}{more}]"
    store.record("job", "RecipeApplied", message)
    ctx.queue.add(JOB)
    ctx.queue.add(REMOVAL)
    return message


async def reconcile_removal(ctx: Ctx) -> Result | None:
    store = ctx.store
    if not store.removing:
        return None
    # One whose launch is in flight is not forgotten yet: its answer queues it again.
    for name in [n for n in store.removing if not store.status[n].alive and n not in ctx.launches]:
        _forget(ctx, name)
    alive = [n for n in store.removing if store.status[n].alive]
    if not alive or store.job.teardown_requested:
        return None  # teardown stops whatever is still alive
    _, members = teardown.lowest_tier(ctx, alive)
    return await teardown.stop_all(ctx, members, ctx.clock.now())


def _forget(ctx: Ctx, name: str) -> None:
    spec = ctx.store.forget(name)
    ctx.queue.add(JOB)
    if spec.pool:
        ctx.queue.add(pool_key(spec.pool))
