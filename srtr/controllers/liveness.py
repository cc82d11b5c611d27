"""Liveness controller: probe a running instance every interval; stop it when it is unhealthy.

Key `liveness/<instance>`. Watching begins `initial_delay_seconds` after the instance is
Ready (after its launch when it has no readiness probe). Each attempt runs as a task of its
own, bounded by `timeout_seconds`. After `failure_threshold` failures in a row the instance
gets an `Unhealthy` warning and is stopped (SIGTERM, its grace, SIGKILL); its exit is then a
failure (`LivenessFailed`) for its restart policy, or its pool's, to decide on.

Where a node agent runs the instance (`Prober.watch`), the agent runs the probe loop and
reports only a failure; the controller then only stops the instance.
"""

from __future__ import annotations

import functools

from srtr.controllers import health_decisions, teardown
from srtr.controllers.context import Ctx, liveness_key
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceSpec


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    spec = store.specs.get(name)
    if spec is None or spec.liveness is None:
        return None
    status = store.status[name]
    if not status.alive or store.job.teardown_requested:
        return None
    if status.liveness_failed:
        return await _stop(ctx, name)
    if status.stop_sent_at is not None or status.kill_sent or status.liveness_in_flight:
        return None
    if status.liveness_on_node:
        return None  # its node's agent probes it and reports a failure (`_reported`)
    due = health_decisions.liveness_due(spec, status)
    if due is None:
        return None  # not Ready yet: the probe controller queues this key when it is
    now = ctx.clock.now()
    report = functools.partial(_reported, ctx, name, status.attempt)
    delay = max(due - now, 0.0)
    if ctx.prober.watch(spec, status, ctx.run_dir, kind="liveness", delay=delay, report=report):
        store.watched_on_node(name, "liveness")
        return None
    if now < due:
        return Result(requeue_after=due - now)
    store.liveness_started(name)
    ctx.spawn(_attempt(ctx, spec, status.attempt))
    return None


async def _attempt(ctx: Ctx, spec: InstanceSpec, attempt: int) -> None:
    store = ctx.store
    status = store.status[spec.name]
    assert spec.liveness is not None
    try:
        ok, message = await ctx.prober.liveness(spec, status, ctx.run_dir)
    except Exception as exc:  # a prober bug must not wedge the instance in "in flight"
        ok, message = False, f"probe error: {exc!r}"
    finally:
        store.liveness_returned(spec.name, status)
    if status.attempt != attempt or not status.alive or status.stop_sent_at is not None:
        return
    failures = store.liveness_result(spec.name, ok=ok, message=message)
    if failures >= spec.liveness.failure_threshold:
        store.unhealthy(spec.name, message)
        ctx.queue.add(liveness_key(spec.name))  # stops it
        return
    ctx.queue.add_after(liveness_key(spec.name), spec.liveness.interval_seconds)


def _reported(ctx: Ctx, name: str, attempt: int, ok: bool, failures: int, message: str) -> None:
    """The node's agent reports that the liveness probe of `attempt` failed (it reports
    nothing else: its loop ends there)."""
    store = ctx.store
    status = store.status.get(name)
    if status is None or status.attempt != attempt or not status.alive or ok:
        return
    if store.job.teardown_requested or status.stop_sent_at is not None:
        return
    store.liveness_reported(name, failures=failures, message=message)
    ctx.queue.add(liveness_key(name))  # stops it


async def _stop(ctx: Ctx, name: str) -> Result | None:
    """SIGTERM, then SIGKILL once its grace has passed; its exit is the instance
    controller's (and its pool's) to judge."""
    wait = await teardown.stop(ctx, name, ctx.clock.now())
    return Result(requeue_after=wait) if wait is not None else None
