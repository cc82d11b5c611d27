"""Job controller: walk the launch stages, then decide how and when the job ends.

Stages (from `expand`) go in order; every instance of a stage is activated at once and the
next stage starts when each of them is ready (or, if not critical, finished). After the last
stage the job ends when the benchmark exits, when every terminal instance has exited (worst
code), on a critical failure (1), or when stopped by a signal (128+n); otherwise it holds.
"""

from __future__ import annotations

from srtr.controllers.context import TEARDOWN, Ctx, instance_key
from srtr.reconciler.store import FINISHED, JobPhase, Phase
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceKind


def begin_teardown(ctx: Ctx, *, exit_code: int, reason: str) -> None:
    """End the job: remember why and with which code, and hand over to the teardown controller.

    The first reason wins; later ones (a second failure during teardown) are only events.
    """
    job = ctx.store.job
    if job.teardown_requested:
        return
    job.teardown_requested = True
    job.exit_code = exit_code
    job.reason = reason
    job.phase = JobPhase.TEARING_DOWN
    ctx.store.set_condition(job.conditions, "Ready", False, "TearingDown", reason)
    ctx.store.record(
        "job",
        "TearingDown",
        f"{reason}; tearing down (exit code {exit_code})",
        warning=exit_code != 0,
    )
    ctx.queue.add(TEARDOWN)


def _stage_done(ctx: Ctx, name: str) -> bool:
    spec = ctx.store.specs[name]
    status = ctx.store.status[name]
    if spec.kind is InstanceKind.BENCHMARK:
        return status.attempt >= 0
    if status.phase in FINISHED:
        return not spec.critical or status.phase is Phase.SUCCEEDED
    return status.alive and status.ready


def replaceable(ctx: Ctx, name: str) -> bool:
    """A lost owner instance whose pool can take a spare node instead (replace_lost)."""
    spec = ctx.store.specs[name]
    return spec.replace_lost and bool(ctx.store.desired.nodes.spares)


def _critical_failure(ctx: Ctx) -> str | None:
    for name, status in ctx.store.status.items():
        spec = ctx.store.specs[name]
        if name not in ctx.store.desired_names:
            continue  # dropped by an edit or a replacement: no longer part of the job
        if spec.critical and status.phase is Phase.LOST and not replaceable(ctx, name):
            return f"critical instance {name} was lost with its node {spec.node}"
        if spec.critical and status.phase is Phase.FAILED:
            how = (
                f"signal {status.exit_signal}" if status.exit_signal else f"code {status.exit_code}"
            )
            return f"critical instance {name} on {spec.node} failed (exit {how}); see {spec.log}"
    return None


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    job = store.job
    if job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) or job.teardown_requested:
        return None
    if job.phase is JobPhase.PENDING:
        job.phase = JobPhase.LAUNCHING
        job.started_at = ctx.clock.now()
        store.record(
            "job",
            "PhaseStarted",
            f"launching {len(store.specs)} instance(s) in {len(store.desired.stages)} "
            f"stage(s) on {len(store.desired.nodes.allocation)} node(s)",
        )
    failure = _critical_failure(ctx)
    if failure:
        begin_teardown(ctx, exit_code=1, reason=failure)
        return None
    stages = store.desired.stages
    for number, stage in enumerate(stages, 1):
        pending = [n for n in stage.instances if not store.status[n].activated]
        if stage.name in job.passed_stages:
            # A live edit added instances to a stage that already passed: start them now,
            # without holding up anything else.
            _activate(ctx, pending)
            continue
        if pending:
            _activate(ctx, pending)
            store.record(
                "job",
                "PhaseStarted",
                f"stage {number}/{len(stages)} {stage.name}: launching "
                f"{len(stage.instances)} instance(s)",
            )
            return None
        if not all(_stage_done(ctx, n) for n in stage.instances):
            return None
        job.passed_stages.add(stage.name)
        job.stage = number
    if job.phase is JobPhase.LAUNCHING:
        job.phase = JobPhase.RUNNING
        store.set_condition(job.conditions, "Ready", True, "AllStagesUp", _ending(ctx))
        store.record("job", "PhaseStarted", "every stage is up; " + _ending(ctx))
    _observe_generation(ctx)
    return _check_end(ctx)


def _activate(ctx: Ctx, names: list[str]) -> None:
    for name in names:
        ctx.store.status[name].activated = True
        ctx.queue.add(instance_key(name))


def _observe_generation(ctx: Ctx) -> None:
    """observed_generation catches up once the last applied edit has fully rolled out."""
    store = ctx.store
    job = store.job
    if job.observed_generation == job.generation or store.removing:
        return
    for name in store.desired_names:
        status = store.status[name]
        if status.user_action == "restart" or not status.activated or status.phase is Phase.PENDING:
            return
    job.observed_generation = job.generation
    store.record("job", "Converged", f"generation {job.generation} is rolled out")


def _ending(ctx: Ctx) -> str:
    if "benchmark" in ctx.store.specs:
        return "waiting for the benchmark to finish"
    if ctx.store.desired.terminal_services:
        names = ", ".join(ctx.store.desired.terminal_services)
        return f"waiting for terminal service(s) to finish: {names}"
    return "holding until stopped (benchmark: manual; Ctrl+C or `srtr down` ends the job)"


def _check_end(ctx: Ctx) -> None:
    store = ctx.store
    bench = store.specs.get("benchmark")
    if bench is not None and bench.kind is InstanceKind.BENCHMARK:
        status = store.status["benchmark"]
        if status.phase in FINISHED:
            code = status.exit_code if status.exit_code is not None else 1
            begin_teardown(ctx, exit_code=code, reason=f"benchmark exited with code {code}")
        return
    terminal = [n for n, s in store.specs.items() if s.terminal]
    if terminal and all(store.status[n].phase in FINISHED for n in terminal):
        code = max((store.status[n].exit_code or 0) for n in terminal)
        verdict = "failed" if code else "finished"
        begin_teardown(
            ctx, exit_code=code, reason=f"terminal service(s) {verdict} (worst exit code {code})"
        )
