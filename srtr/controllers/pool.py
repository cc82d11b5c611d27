"""Pool controller: a pool is ready when every one of its owner instances is ready."""

from __future__ import annotations

from srtr.controllers.context import Ctx
from srtr.reconciler.workqueue import Result


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    members = [m for m in store.instances_of_pool(name) if m not in store.removing]
    ready = sum(1 for m in members if store.status[m].alive and store.status[m].ready)
    is_ready = bool(members) and ready == len(members)
    if is_ready != store.pool_ready.get(name, False):
        store.pool_ready[name] = is_ready
        if store.job.teardown_requested:
            store.changed()  # losing readiness is the point of a teardown, not news
            return None
        store.record(
            f"pool/{name}",
            "PoolReady" if is_ready else "PoolNotReady",
            f"{name} {ready}/{len(members)} ready",
            warning=not is_ready,
        )
    return None
