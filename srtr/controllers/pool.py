"""Pool controller: a pool is ready when every one of its owner instances is ready.

A terminal owner that exited 0 (rank 0 of a torchrun-style pool, done first) has finished
its work: the pool is no longer ready, but that is no warning (`pool_readiness`'s `done`).
An autoscaled pool's `scale/<pool>` key is queued from here (`autoscale`)."""

from __future__ import annotations

from srtr.controllers import autoscale
from srtr.controllers.context import Ctx, scale_key
from srtr.reconciler.workqueue import Result
from srtr.store.status import Phase


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    members = [m for m in store.instances_of_pool(name) if m not in store.removing]
    ready = sum(1 for m in members if store.status[m].alive and store.status[m].ready)
    done = sum(
        1 for m in members if store.specs[m].terminal and store.status[m].phase is Phase.SUCCEEDED
    )
    store.pool_readiness(name, ready=ready, total=len(members), done=done)
    if name in autoscale.autoscaled(store):  # its publisher may be ready now
        ctx.queue.add(scale_key(name))
    return None
