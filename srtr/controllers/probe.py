"""Probe controller: run an instance's readiness probe every interval, before and after Ready.

A probe attempt runs as its own task, so a slow probe never holds the work queue. While the
instance's stage gate is open, its deadline is `timeout_seconds` after the stage began, and
missing it is the job controller's to judge: the stage gate fails the job. After the gate
(a restart later on, an instance a live edit added), the deadline counts from the attempt's
start: a critical instance not ready by then fails the job; any other is killed and falls
to its restart policy.

Once Ready, the probe keeps running every interval (but a log pattern's, which stays
matched): `failure_threshold` failures in a row make the instance NotReady, and the next
pass Ready again. It is not restarted for that; liveness is what restarts.
"""

from __future__ import annotations

import functools
import signal

from srtr.controllers import decisions, health_decisions
from srtr.controllers.context import JOB, Ctx, liveness_key, pool_key, probe_key
from srtr.controllers.job import begin_teardown
from srtr.controllers.pace import wake
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceSpec
from srtr.store.store import Phase


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    spec = store.specs.get(name)
    if spec is None or spec.probe is None:
        return None
    status = store.status[name]
    if store.job.teardown_requested or status.probe_in_flight or status.kill_sent:
        return None
    if status.alive and status.passed_readiness and status.stop_sent_at is None:
        return _watch(ctx, spec)
    if not status.alive or status.ready or status.phase is not Phase.STARTING:
        return None
    now = ctx.clock.now()
    gate_started_at = store.gate_opened_at(spec.stage)
    deadline = decisions.readiness_deadline(spec, status, gate_started_at=gate_started_at)
    if now >= deadline:
        if gate_started_at is not None:
            ctx.queue.add(JOB)  # the stage gate fails the job
        else:
            await _not_ready(ctx, spec)
        return None
    if spec.deferred_probe and gate_started_at is not None and _peers_to_launch(ctx, spec):
        return None  # the instance controller enqueues it once its stage's last member launched
    if status.next_probe_at is not None and now < status.next_probe_at:
        return Result(requeue_after=status.next_probe_at - now)
    store.probe_started(name)
    ctx.spawn(_attempt(ctx, spec, status.attempt))
    return None


def _peers_to_launch(ctx: Ctx, spec: InstanceSpec) -> bool:
    stage = next((s for s in ctx.store.desired.stages if s.name == spec.stage), None)
    return stage is not None and decisions.deferred_probe_waits(stage, ctx.store.status)


async def _attempt(ctx: Ctx, spec: InstanceSpec, attempt: int) -> None:
    store = ctx.store
    status = store.status[spec.name]
    assert spec.probe is not None
    try:
        ok, message = await ctx.prober.check(spec, status, ctx.run_dir)
    except Exception as exc:  # a prober bug must not wedge the instance in "in flight"
        ok, message = False, f"probe error: {exc!r}"
    finally:
        store.probe_returned(spec.name, status)
    if status.attempt != attempt or not status.alive:
        return
    if ok:
        store.probe_passed(spec.name)
        _readiness_changed(ctx, spec)
        if spec.liveness is not None:
            ctx.queue.add(liveness_key(spec.name))  # liveness counts from Ready
        ctx.queue.add(probe_key(spec.name))  # watched after the gate (`_watch`) from now
        return
    store.probe_failed(spec.name, message)
    ctx.queue.add_after(probe_key(spec.name), spec.probe.interval_seconds)


def _readiness_changed(ctx: Ctx, spec: InstanceSpec) -> None:
    wake(ctx, JOB)
    ctx.queue.add("exporters")  # a Ready instance's metrics are a scrape target
    if spec.pool:
        wake(ctx, pool_key(spec.pool))


def _watch(ctx: Ctx, spec: InstanceSpec) -> Result | None:
    """After the gate: one attempt per interval, to tell Ready from NotReady."""
    status = ctx.store.status[spec.name]
    if not health_decisions.watches_readiness(spec) or status.readiness_on_node:
        return None
    now = ctx.clock.now()
    delay = max((status.next_probe_at or now) - now, 0.0)
    report = functools.partial(_reported, ctx, spec, status.attempt)
    if ctx.prober.watch(spec, status, ctx.run_dir, kind="readiness", delay=delay, report=report):
        ctx.store.watched_on_node(spec.name, "readiness")  # its agent reports transitions
        return None
    if status.next_probe_at is not None and now < status.next_probe_at:
        return Result(requeue_after=status.next_probe_at - now)
    ctx.store.probe_started(spec.name)
    ctx.spawn(_watch_attempt(ctx, spec, status.attempt))
    return None


def _reported(
    ctx: Ctx, spec: InstanceSpec, attempt: int, ok: bool, failures: int, message: str
) -> None:
    """A transition of the readiness that the node's agent watches."""
    status = ctx.store.status.get(spec.name)
    if status is None or status.attempt != attempt or not status.alive:
        return
    if ctx.store.readiness_reported(spec.name, ok=ok, failures=failures, message=message):
        _readiness_changed(ctx, spec)


async def _watch_attempt(ctx: Ctx, spec: InstanceSpec, attempt: int) -> None:
    store = ctx.store
    status = store.status[spec.name]
    assert spec.probe is not None
    try:
        ok, message = await ctx.prober.check(spec, status, ctx.run_dir)
    except Exception as exc:  # as `_attempt`
        ok, message = False, f"probe error: {exc!r}"
    finally:
        store.probe_returned(spec.name, status)
    if status.attempt != attempt or not status.alive:
        return
    if store.readiness_watched(spec.name, ok=ok, message=message):
        _readiness_changed(ctx, spec)
    ctx.queue.add_after(probe_key(spec.name), spec.probe.interval_seconds)


async def _not_ready(ctx: Ctx, spec: InstanceSpec) -> None:
    """After the gate: not ready within `timeout_seconds` of the attempt's start."""
    text = decisions.not_ready_within(spec)
    ctx.store.not_ready_in_time(spec.name, text)
    if spec.critical:
        begin_teardown(ctx, exit_code=1, reason=text, failed=True)
        return
    # Like a failed Kubernetes startup probe: kill it and let its restart policy decide.
    ctx.store.killing(spec.name)
    await ctx.backend.signal(spec.name, signal.SIGKILL)
