"""`depends_on` in the job and instance controllers: the dependents' stages, their launch
gate, and their restarts with a dependency that has `restart: true`.

The job controller (`job.py`) walks the stages through `dependency_decisions.start_step`
when the job has dependencies, and applies its outcome here. An instance of a service with
`depends_on` launches only while its conditions hold (`launch_waits`), so a dependent
restarted with its dependency, or after a crash of its own, starts again once the
dependency is back. The decisions are `dependency_decisions`; this module applies them
through the store.
"""

from __future__ import annotations

from srtr.controllers import decisions
from srtr.controllers import dependency_decisions as deps
from srtr.controllers.context import Ctx, fleet_key, instance_key
from srtr.resources.objects import InstanceSpec
from srtr.store.store import Phase


def apply(ctx: Ctx, step: deps.GraphStep) -> None:
    """Begin the dependents' stages that may begin, mark the ones up, say who waits."""
    store = ctx.store
    for number, name in step.passed:
        store.stage_passed(number, name)
    begun: set[str] = set()
    for number, stage in step.started:
        names = tuple(n for n in stage.instances if not store.status[n].activated)
        store.launch_stage(number, stage, names)
        begun.update(names)
    for name in step.activate:
        if name not in begun:
            store.activate(name)  # a live edit grew a dependent's stage that passed
        ctx.queue.add(instance_key(name))
    for stage in step.fleets:
        ctx.queue.add(fleet_key(stage.name))
    store.dependents_waiting(step.waiting)


def gates(ctx: Ctx) -> list[decisions.Gate]:
    """The verdicts on the open gates of the dependents' stages (as the chain's one)."""
    store = ctx.store
    stages = store.desired.stages
    free = deps.floating(stages, store.specs, store.desired.dependencies)
    out = []
    for stage in deps.open_floating(stages, free, store.status, store.job.passed_stages):
        started = store.gate_opened_at(stage.name)
        if started is not None:
            out.append(
                decisions.stage_gate(
                    stage, store.specs, store.status, started_at=started, now=ctx.clock.now()
                )
            )
    return out


def restarts(ctx: Ctx) -> None:
    """Restart the dependents whose `restart: true` dependency restarted, and wake the
    dependents waiting for their launch whose conditions hold again."""
    store = ctx.store
    edges = store.desired.dependencies
    if store.job.teardown_requested:
        return
    for name, on in deps.to_restart(edges, store.status):
        store.dependency_restart(name, on)
        ctx.queue.add(instance_key(name))
    ready = {e.service for e in edges} - {e.service for e in deps.unmet_all(edges, store.status)}
    for edge in edges:
        if edge.service not in ready:
            continue
        for name in edge.dependents:
            status = store.status.get(name)
            if status is not None and status.activated and _waits_for_launch(status.phase):
                ctx.queue.add(instance_key(name))


def _waits_for_launch(phase: Phase) -> bool:
    return phase in (Phase.PENDING, Phase.BACKOFF)


def launch_waits(ctx: Ctx, spec: InstanceSpec) -> bool:
    """Whether the instance's launch waits for its service's depends_on conditions."""
    edges = ctx.store.desired.dependencies
    return bool(edges) and bool(deps.unmet(spec.service, edges, ctx.store.status))


def on_exit(ctx: Ctx, spec: InstanceSpec) -> None:
    """The instance's attempt ended: if a `restart: true` dependency of it restarted (a
    Dask worker exits 0 when its scheduler goes away), it restarts with it, not by its own
    policy, and its budget is not spent."""
    store = ctx.store
    edges = [e for e in store.desired.dependencies if e.service == spec.service and e.restart]
    if not edges or store.job.teardown_requested:
        return
    for name, on in deps.to_restart(edges, store.status):
        if name == spec.name:
            store.dependency_restart(name, on)
            return
