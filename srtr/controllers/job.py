"""Job controller: walk the launch stages, then decide how and when the job ends.

Stages (from `expand`) go in order; every instance of a stage is activated at once and the
next stage starts when each of them is ready (or, if not critical, finished). The stage
gate fails the job (1), as srtctl's does, critical or not, when a member ends for good
before passing its probe, never ran (its launch failed, or it exited with 127/126), or is
not ready `timeout_seconds` after the stage began; later, a service none of whose instances
could start fails it too (`unstartable`). After the
last stage the job ends when the benchmark exits, when every terminal instance has exited
(the first failure's code), on a critical failure (1), or when stopped by a signal (128+n);
otherwise it holds. The decisions are `decisions.stage_gate`, `next_stage`, `critical_failure` and
`job_end`, and `fleet_decisions.fleet_gate` for a stage that waits on a whole cluster
(a `ray` service: every member alive at the head); this module applies them through the store.
"""

from __future__ import annotations

import signal

from srtr.controllers import (
    decisions,
    dependencies,
    dependency_decisions,
    edit_decisions,
    fleet_decisions,
    health_decisions,
)
from srtr.controllers.context import TEARDOWN, Ctx, fleet_key, gang_key, instance_key
from srtr.reconciler.workqueue import Result
from srtr.store import causes
from srtr.store.store import JobPhase


def begin_teardown(ctx: Ctx, *, exit_code: int, reason: str, failed: bool = False) -> None:
    """End the job: remember why and with which code, and hand over to the teardown controller.

    The first reason wins; later ones (a second failure during teardown) are only events.
    A job that `failed` (not one stopped by a user or a signal) names its first failure in
    its reason, whatever instance's end decided it.
    """
    if failed and exit_code != 0:
        reason = causes.with_first_failure(reason, ctx.store.job.cause)
    if ctx.store.begin_teardown(exit_code=exit_code, reason=reason):
        ctx.queue.add(TEARDOWN)
        for pool in ctx.store.gangs:  # members held for a pool restart end now
            ctx.queue.add(gang_key(pool))


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    job = store.job
    if job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) or job.teardown_requested:
        return None
    if job.phase is JobPhase.PENDING:
        store.job_launching()
    # Only a live edit adds instances (each edit a generation): none to look at before one.
    alone = (
        edit_decisions.failed_alone(store.specs, store.status, store.desired_names)
        if job.generation > 1
        else set()
    )
    if alone:
        store.edit_failed(alone)
    gate = _gate(ctx)
    if gate.failed is not None and gate.failed not in alone:
        if gate.timed_out:
            store.not_ready_in_time(gate.failed, gate.reason)
        if gate.kill and store.status[gate.failed].alive:
            # a clone or build past its timeout is killed at once, not after a grace
            store.killing(gate.failed)
            await ctx.backend.signal(gate.failed, signal.SIGKILL)
        begin_teardown(ctx, exit_code=1, reason=gate.reason, failed=True)
        return None
    failure = _failure(ctx, alone)
    if failure is not None:
        begin_teardown(ctx, exit_code=failure.exit_code, reason=failure.reason, failed=True)
        return None
    if not _launch_stages(ctx):
        # Look again at the next readiness deadline of the open gate (a stage that began
        # just now is looked at again once its members launched).
        return Result(requeue_after=gate.wake_in) if gate.wake_in is not None else None
    if job.phase is JobPhase.LAUNCHING:
        store.job_running(_ending(ctx))
    if job.observed_generation != job.generation and not store.removing:
        if decisions.rolled_out(store.status, store.desired_names):
            store.converged()
    end = decisions.job_end(store.specs, store.status)
    if end is not None:
        begin_teardown(ctx, exit_code=end.exit_code, reason=end.reason, failed=True)
    return None


def _launch_stages(ctx: Ctx) -> bool:
    """Take the launch stages' next step (the chain's and, with depends_on, the
    dependents'); whether every stage is up."""
    store = ctx.store
    stages, passed, fleets = store.desired.stages, store.job.passed_stages, store.fleets_passed()
    edges = store.desired.dependencies
    if not edges:
        step = decisions.next_stage(stages, store.specs, store.status, passed, fleets)
        _apply_chain(ctx, step)
        return step.all_up
    graph = dependency_decisions.start_step(
        stages, edges, store.specs, store.status, passed, fleets
    )
    _apply_chain(ctx, graph.chain)
    dependencies.apply(ctx, graph)
    dependencies.restarts(ctx)
    return graph.all_up


def _apply_chain(ctx: Ctx, step: decisions.StageStep) -> None:
    store = ctx.store
    for number, name in step.passed:
        store.stage_passed(number, name)
    for name in step.settled:
        store.settled(name)
    late = frozenset(step.late)
    for name in step.late:
        store.activate_late(name)
    if step.started is not None:
        number, stage = step.started
        store.launch_stage(number, stage, tuple(n for n in step.activate if n not in late))
    else:
        for name in step.activate:
            if name not in late:
                store.activate(name)
    for name in step.activate:
        ctx.queue.add(instance_key(name))
    if step.fleet is not None:
        ctx.queue.add(fleet_key(step.fleet.name))


def _failure(ctx: Ctx, alone: set[str]) -> decisions.EndJob | None:
    """A failure that ends the job whatever its stage: a critical instance's, a service
    that cannot start, a terminal or critical pool out of restarts. What a live edit added
    and failed alone (`alone`) is not counted: everything that ran before goes on."""
    store = ctx.store
    # Not a copy of the 80,000 names on every look, for the rare edit that failed alone.
    counted = store.desired_names - alone if alone else store.desired_names
    failure = decisions.critical_failure(
        store.specs, store.status, counted, spares=bool(store.desired.nodes.spares)
    ) or decisions.unstartable(store.specs, store.status, counted)
    failure = failure or dependency_decisions.init_failure(
        store.desired.dependencies, store.specs, store.status
    )
    if failure:
        return decisions.EndJob(1, failure)
    return health_decisions.pool_failure(store.gangs, store.specs)


def _gate(ctx: Ctx) -> decisions.Gate:
    """The verdict on the open stage gates: the chain's, the dependents' stages', and the
    per-node setups of nodes a service gained after its stage passed."""
    store = ctx.store
    late = edit_decisions.late_setup_gate(
        store.desired.stages, store.specs, store.status, now=ctx.clock.now()
    )
    gates = [late, _chain_gate(ctx)]
    if store.desired.dependencies:
        gates.extend(dependencies.gates(ctx))
    waits = []
    for gate in gates:
        if gate.failed is not None:
            return gate
        if gate.wake_in is not None:
            waits.append(gate.wake_in)
    return decisions.Gate(wake_in=min(waits) if waits else None)


def _chain_gate(ctx: Ctx) -> decisions.Gate:
    """The verdict on the chain's open stage gate, if a stage is waited for."""
    store = ctx.store
    stage = decisions.open_stage(store.desired.stages, store.status, store.job.passed_stages)
    started = store.gate_opened_at(stage.name) if stage is not None else None
    if stage is None or started is None:
        return decisions.Gate()
    gate = decisions.stage_gate(
        stage, store.specs, store.status, started_at=started, now=ctx.clock.now()
    )
    if gate.failed is not None or stage.fleet is None:
        return gate
    fleet = store.fleet(stage.name)
    verdict = fleet_decisions.fleet_gate(
        stage,
        store.specs,
        store.status,
        opened_at=fleet.opened_at,
        alive=fleet.alive,
        now=ctx.clock.now(),
    )
    if verdict.failed is not None:
        return verdict
    # Wake for whichever comes first: a member's readiness deadline or the fleet's timeout.
    waits = [w for w in (gate.wake_in, verdict.wake_in) if w is not None]
    return decisions.Gate(wake_in=min(waits) if waits else None)


def _ending(ctx: Ctx) -> str:
    if "benchmark" in ctx.store.specs:
        return "waiting for the benchmark to finish"
    if ctx.store.desired.terminal_services:
        names = ", ".join(ctx.store.desired.terminal_services)
        return f"waiting for terminal service(s) to finish: {names}"
    return "holding until stopped (benchmark: manual; Ctrl+C or `srtr down` ends the job)"
