"""Take over a job whose controller crashed: restore its status, adopt what still runs.

`srtr up --adopt RUN_DIR` (or `srtr up` again on a run dir whose controller is dead) reads
the run dir's state.json, puts every instance's status back into a fresh store, and asks the
backend to adopt each instance that was alive (local: by pid and kernel start time). Adopted
instances keep their pid and restart count; their probes resume from the saved log offset.
An instance that is gone is treated as exited with an unknown status: its restart policy
decides. Generation, passed stages and the job's phase carry over, so the job goes on where
it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from srtr.controllers.context import (
    JOB,
    TEARDOWN,
    Ctx,
    instance_key,
    liveness_key,
    pool_key,
    probe_key,
)
from srtr.store.rundir import InstanceDoc, RunState


def restore(ctx: Ctx, state: RunState) -> list[tuple[str, InstanceDoc]]:
    """Put state.json's statuses into the store; return (name, record) of those to adopt."""
    store = ctx.store
    store.restore_job(state.job)
    to_adopt = []
    for record in state.instances:
        name = record.get("name")
        if name in store.status and store.restored(name, record):
            to_adopt.append((name, record))
    return to_adopt


async def adopt(ctx: Ctx, doc: Mapping[str, Any]) -> tuple[int, int]:
    """Restore and adopt the job of state.json `doc` (as `srtr up --adopt` read it); return
    (adopted, gone). Everything is enqueued to converge."""
    store = ctx.store
    to_adopt = restore(ctx, RunState.from_doc(doc))
    adopted = gone = 0
    for name, record in to_adopt:
        identity = record.get("identity")
        attempt = store.status[name].attempt
        if identity and await ctx.backend.adopt(name, attempt, identity):
            adopted += 1
            store.adopted(name, identity)
            # Its probes go on: readiness (to Ready, or watched after it) and liveness.
            ctx.queue.add(probe_key(name))
            ctx.queue.add(liveness_key(name))
        else:
            store.gone(name)  # gone while no controller watched: an exit of unknown status
            gone += 1
        ctx.queue.add(instance_key(name))
    store.record(
        "job",
        "Adopted",
        f"took over from a crashed controller: {adopted} instance(s) adopted, {gone} gone",
        warning=gone > 0,
    )
    for pool in store.desired.pools:
        ctx.queue.add(pool_key(pool.name))
    ctx.queue.add(JOB)
    if store.job.teardown_requested:
        ctx.queue.add(TEARDOWN)
    return adopted, gone
