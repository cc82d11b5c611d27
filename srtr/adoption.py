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

from typing import Any

from srtr.controllers.context import JOB, TEARDOWN, Ctx, instance_key, pool_key, probe_key
from srtr.reconciler.store import ALIVE, JobPhase, Phase


def restore(ctx: Ctx, doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Put state.json's statuses into the store; return (name, record) of those to adopt."""
    store = ctx.store
    job = doc["job"]
    store.job.generation = int(job.get("generation", 1))
    store.job.observed_generation = int(job.get("observed_generation", 0))
    store.job.passed_stages = set(job.get("passed_stages", []))
    store.job.stage = int(job.get("stage", 0))
    phase = JobPhase(job.get("phase", "Pending"))
    store.job.phase = JobPhase.LAUNCHING if phase is JobPhase.PENDING else phase
    if phase is JobPhase.TEARING_DOWN:
        store.job.teardown_requested = True
        store.job.exit_code = job.get("exit_code")
        store.job.reason = str(job.get("reason", "teardown"))
    to_adopt = []
    for record in doc.get("instances", []):
        name = record.get("name")
        if name not in store.status:
            continue
        status = store.status[name]
        status.phase = Phase(record.get("phase", "Pending"))
        status.ready = bool(record.get("ready"))
        status.restarts = int(record.get("restarts", 0))
        status.attempt = int(record.get("attempt", -1))
        status.activated = bool(record.get("activated")) or status.attempt >= 0
        status.pid = record.get("pid")
        status.step = record.get("step")
        status.exit_code = record.get("exit_code")
        status.log_offset = int(record.get("log_offset", 0))
        status.history = list(record.get("history", []))
        status.started_at = ctx.clock.now()  # probe timeouts restart from the adoption
        if status.phase in ALIVE:
            to_adopt.append((name, record))
    return to_adopt


async def adopt(ctx: Ctx, doc: dict[str, Any]) -> tuple[int, int]:
    """Restore and adopt; return (adopted, gone). Everything is enqueued to converge."""
    store = ctx.store
    to_adopt = restore(ctx, doc)
    adopted = gone = 0
    adopt_one = getattr(ctx.backend, "adopt", None)
    for name, record in to_adopt:
        status = store.status[name]
        identity = record.get("identity")
        ok = bool(adopt_one and identity and await adopt_one(name, status.attempt, identity))
        if ok:
            status.alive = True
            status.identity = identity
            adopted += 1
            if store.specs[name].probe is not None and not status.ready:
                status.phase = Phase.STARTING
                ctx.queue.add(probe_key(name))
        else:
            # Gone while no controller watched: an exit of unknown status.
            status.alive = False
            status.exit_code = None
            status.exited_attempt = status.attempt
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
