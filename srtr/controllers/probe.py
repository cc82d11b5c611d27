"""Probe controller: run an instance's readiness probe every interval until it passes or times out.

A probe attempt runs as its own task, so a slow probe never holds the work queue. An instance
that is not ready by `timeout_seconds` fails the job when it is critical; otherwise it is
killed and falls to its restart policy.
"""

from __future__ import annotations

import signal

from srtr.controllers.context import JOB, Ctx, pool_key, probe_key
from srtr.controllers.job import begin_teardown
from srtr.reconciler.store import Phase
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceKind, InstanceSpec


def describe_owner(spec: InstanceSpec) -> str:
    if spec.kind is InstanceKind.WORKER:
        return f"roles.{spec.service} worker {spec.index}"
    return "frontend" if spec.kind is InstanceKind.FRONTEND else f"services[{spec.service}]"


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    spec = store.specs.get(name)
    if spec is None or spec.probe is None:
        return None
    status = store.status[name]
    if not status.alive or status.ready or status.phase is not Phase.STARTING:
        return None
    if store.job.teardown_requested or status.probe_in_flight or status.kill_sent:
        return None
    now = ctx.clock.now()
    assert status.started_at is not None
    if now >= status.started_at + spec.probe.timeout_seconds:
        await _not_ready(ctx, spec)
        return None
    if status.next_probe_at is not None and now < status.next_probe_at:
        return Result(requeue_after=status.next_probe_at - now)
    store.probe_started(name)
    ctx.spawn(_attempt(ctx, spec, status.attempt))
    return None


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
        ctx.queue.add(JOB)
        ctx.queue.add("exporters")  # a Ready instance's metrics become a scrape target
        if spec.pool:
            ctx.queue.add(pool_key(spec.pool))
        return
    store.probe_failed(spec.name, message)
    ctx.queue.add_after(probe_key(spec.name), spec.probe.interval_seconds)


async def _not_ready(ctx: Ctx, spec: InstanceSpec) -> None:
    assert spec.probe is not None
    text = (
        f"{describe_owner(spec)} on {spec.node} was not ready within "
        f"{spec.probe.timeout_seconds:g}s ({spec.probe.describe(spec.node_ip)}); "
        f"see {spec.log}"
    )
    status = ctx.store.status[spec.name]
    if status.probe_message:
        text += f"; last probe: {status.probe_message}"
    ctx.store.record(f"instance/{spec.name}", "ProbeFailed", text, warning=True)
    if spec.critical:
        begin_teardown(ctx, exit_code=1, reason=text)
        return
    # Like a failed Kubernetes startup probe: kill it and let its restart policy decide.
    ctx.store.killing(spec.name)
    await ctx.backend.signal(spec.name, signal.SIGKILL)
