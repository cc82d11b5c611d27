"""Live recipe edits: apply a Plan to the store, and stop what an edit removed, tier by tier.

`apply` only rewrites desired state and marks intents (restart, remove); the instance, job
and removal controllers converge. The removal controller stops dropped instances the way
teardown stops a job: lowest tier first, SIGTERM, SIGKILL after the grace, next tier when the
previous one is gone; then their records leave the store.
"""

from __future__ import annotations

from srtr.controllers import exporter, teardown
from srtr.controllers.context import JOB, Ctx, instance_key, pool_key
from srtr.reconciler.store import InstanceStatus
from srtr.reconciler.workqueue import Result
from srtr.resources.diff import Plan
from srtr.resources.objects import DesiredState

REMOVAL = "removal"


def propose(ctx: Ctx, new: DesiredState, plan: Plan, text: str, *, auto: bool) -> None:
    """A valid edit arrived: apply it now (auto), or hold it for the user's yes (confirm)."""
    store = ctx.store
    if plan.refused:
        reject(ctx, [f"refused live: {reason}" for reason in plan.refused], plan)
        return
    if plan.empty:
        store.recipe_text = text  # e.g. only comments changed: nothing to roll out
        store.recipe_view = {"pending": None, "rejected": None}
        store.changed()
        return
    if auto:
        apply(ctx, new, plan, text)
        return
    store.pending = (new, plan, text)
    store.recipe_view = {"pending": plan.to_json(), "rejected": None}
    store.record(
        "job", "PlanPending", f"recipe changed: {plan.summary()}; apply with `a` in the TUI"
    )


def reject(ctx: Ctx, lines: list[str], plan: Plan | None = None) -> None:
    """Record a refused edit; nothing running is touched."""
    store = ctx.store
    store.recipe_view = {
        "pending": None,
        "rejected": lines,
        "plan": plan.to_json() if plan else None,
    }
    store.record("job", "RecipeRejected", "; ".join(lines), warning=True)


def apply_pending(ctx: Ctx) -> str:
    store = ctx.store
    if store.pending is None:
        raise LookupError("no recipe change is waiting to be applied")
    new, plan, text = store.pending
    store.pending = None
    return apply(ctx, new, plan, text)


def discard_pending(ctx: Ctx) -> str:
    store = ctx.store
    if store.pending is None:
        raise LookupError("no recipe change is waiting")
    store.pending = None
    store.recipe_view = {"pending": None, "rejected": None}
    store.record("job", "PlanDiscarded", "the pending recipe change was discarded")
    return "discarded"


def apply(ctx: Ctx, new: DesiredState, plan: Plan, text: str = "") -> str:
    """Make `new` the desired state; returns the event message. The plan must be applicable."""
    store = ctx.store
    job = store.job
    job.generation += 1
    store.recipe_text = text or store.recipe_text
    store.recipe_view = {"pending": None, "rejected": None, "applied": plan.to_json()}
    after = {s.name: s for s in new.instances}
    for change in plan.add:
        store.specs[change.name] = after[change.name]
        store.status[change.name] = InstanceStatus()
        ctx.queue.add(instance_key(change.name))
    for change in plan.restart:
        store.specs[change.name] = after[change.name]
        status = store.status[change.name]
        if status.alive:
            status.user_action = "restart"
        ctx.queue.add(instance_key(change.name))
    for change in plan.hot:
        store.specs[change.name] = after[change.name]
    for change in plan.remove:
        store.removing.add(change.name)
    store.desired = new
    store.desired_names = set(after)
    exporter.desired_changed(ctx)  # skip instances whose binary is missing; re-list targets
    for pool in new.pools:
        store.pool_ready.setdefault(pool.name, False)
        ctx.queue.add(pool_key(pool.name))
    message = f"generation {job.generation}: {plan.summary()}"
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
    for name in [n for n in store.removing if not store.status[n].alive]:
        _forget(ctx, name)
    alive = [n for n in store.removing if store.status[n].alive]
    if not alive or store.job.teardown_requested:
        return None  # teardown stops whatever is still alive
    _, members = teardown.lowest_tier(ctx, alive)
    return await teardown.stop_all(ctx, members, ctx.clock.now())


def _forget(ctx: Ctx, name: str) -> None:
    store = ctx.store
    spec = store.specs.pop(name)
    store.status.pop(name)
    store.removing.discard(name)
    store.record(
        f"instance/{name}",
        "Stopped",
        f"removed by generation {store.job.generation} (was on {spec.node})",
    )
    ctx.queue.add(JOB)
    if spec.pool:
        ctx.queue.add(pool_key(spec.pool))
