"""Pool controller: a pool is ready when every one of its owner instances is ready."""

from __future__ import annotations

from srtr.controllers.context import Ctx
from srtr.reconciler.workqueue import Result


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    members = [m for m in store.instances_of_pool(name) if m not in store.removing]
    ready = sum(1 for m in members if store.status[m].alive and store.status[m].ready)
    store.pool_readiness(name, ready=ready, total=len(members))
    return None
