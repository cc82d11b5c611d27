"""Instance controller: launch an instance when its stage is active, apply its restart policy.

`reconcile(ctx, name)` is level-triggered: it looks at the instance's spec and status and
takes one step (launch, decide after an exit, wait out a backoff). Stopping during teardown
belongs to `teardown.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from srtr.backends.base import (
    LaunchError,
    LaunchSpec,
    NodeLostError,
    Observation,
    ObservationKind,
)
from srtr.controllers import (
    decisions,
    dependencies,
    gang,
    health_decisions,
    replacement,
    teardown,
)
from srtr.controllers.context import (
    JOB,
    TEARDOWN,
    Ctx,
    gang_key,
    instance_key,
    liveness_key,
    pool_key,
    probe_key,
)
from srtr.controllers.pace import wake, wake_first
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceSpec
from srtr.store.store import Phase, UserAction
from srtr.store.write_faults import open_log

# Ended for good, and a user's restart may start them again (a Lost one's node is gone).
RESTARTABLE = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED})

log = logging.getLogger("srtr")


def observe(ctx: Ctx, obs: Observation) -> None:
    """Backend listener: record what happened, then enqueue everyone who cares."""
    store = ctx.store
    if obs.kind is ObservationKind.STARTED:
        store.started(obs.name, attempt=obs.attempt, step=obs.step)
        return
    lost = obs.kind is ObservationKind.LOST
    if not store.exited(
        obs.name,
        attempt=obs.attempt,
        exit_code=obs.exit_code,
        signal=obs.signal,
        message=obs.message,
        lost=lost,
        reason=obs.reason,
    ):
        return
    if lost:
        replacement.note_lost(ctx, obs)
        ctx.queue.add(replacement.KEY)
        gang.on_lost(ctx, store.spec(obs.name))
    ctx.queue.add("exporters")  # an exited instance's targets leave the targets file
    _enqueue_related(ctx, store.spec(obs.name))


def _enqueue_related(ctx: Ctx, spec: InstanceSpec) -> None:
    ctx.queue.add(instance_key(spec.name))
    wake(ctx, JOB)
    if spec.pool:
        wake(ctx, pool_key(spec.pool))
    if ctx.store.job.teardown_requested:
        wake(ctx, TEARDOWN)


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    spec = store.specs.get(name)
    if spec is None:
        return None
    if name in ctx.launches:
        return None  # its launch's answer queues this key again (`_await_launch`)
    status = store.status[name]
    if name in store.removing:
        ctx.queue.add("removal")  # the removal controller owns dropped instances
        return None
    if status.alive:
        if name in store.unidentified:
            store.identified(name, ctx.backend.identity(name))
        if status.user_action and not store.job.teardown_requested:
            return await _stop_for_user(ctx, spec)
        return None
    if status.exited:
        result = _after_exit(ctx, spec)
        wake(ctx, JOB)  # the job decides on the instance's new phase
        return result
    if status.phase is Phase.LOST:
        return None
    if store.job.teardown_requested or status.user_action is UserAction.STOP:
        if status.phase in (Phase.BACKOFF, Phase.PENDING) and status.activated:
            store.finished(name, Phase.STOPPED)
        return None
    if status.gang_held:
        return None  # its pool's restart relaunches it (`gang.reconcile`)
    if status.user_action is UserAction.RESTART and status.phase is Phase.BACKOFF:
        store.restart_now(name)
    elif status.user_action is UserAction.RESTART and status.phase in RESTARTABLE:
        store.relaunch(name)  # ended for good: nothing would ever read the request otherwise
    if not status.activated or dependencies.launch_waits(ctx, spec):
        return None  # the job controller queues it when its stage or its conditions come
    now = ctx.clock.now()
    if status.phase is Phase.PENDING:
        return await _launch(ctx, spec)
    if status.phase is Phase.BACKOFF:
        assert status.next_start_at is not None
        if now < status.next_start_at:
            return Result(requeue_after=status.next_start_at - now)
        return await _launch(ctx, spec)
    return None


async def _stop_for_user(ctx: Ctx, spec: InstanceSpec) -> Result | None:
    """SIGTERM for a user's restart/stop; SIGKILL once the instance's grace has passed."""
    wait = await teardown.stop(ctx, spec.name, ctx.clock.now())
    return Result(requeue_after=wait) if wait is not None else None


def _after_exit(ctx: Ctx, spec: InstanceSpec) -> Result | None:
    """The instance's process is gone: finished, stopped, or due for a restart (its own,
    or its pool's: `gang.on_exit`)."""
    store = ctx.store
    dependencies.on_exit(ctx, spec)  # its dependency restarted: it restarts with it
    if gang.on_exit(ctx, spec):
        return None
    decision = decisions.after_exit(
        spec,
        store.status[spec.name],
        now=ctx.clock.now(),
        jitter=ctx.jitter(),
        tearing_down=store.job.teardown_requested,
    )
    match decision:
        case decisions.RestartNow():
            store.restart_now(spec.name)
            return Result(requeue_after=0)
        case decisions.Finish(phase=phase):
            store.finished(spec.name, phase)
        case decisions.GiveUp(restarts=restarts, window_start=start, code=code):
            store.gave_up(spec.name, restarts=restarts, window_start=start, code=code)
        case decisions.Restart():
            store.backing_off(
                spec.name,
                start_at=decision.start_at,
                delay=decision.delay,
                backoff_index=decision.backoff_index,
                restarts=decision.restarts,
                window_start=decision.window_start,
                code=decision.code,
            )
            return Result(requeue_after=decision.delay)
    return None


async def _launch(ctx: Ctx, spec: InstanceSpec) -> Result | None:
    """Start the instance's next attempt: awaited here, or, where the backend answers over a
    network (`Capabilities.launches_in_flight`), in a task of its own, so that the launches
    of a stage overlap their round trips instead of paying them one after another. They are
    still begun one at a time, in the order their keys come."""
    store = ctx.store
    limit = ctx.backend.capabilities.launches_in_flight
    if limit > 0 and len(ctx.launches) >= limit:
        await ctx.launches.slot(limit)
        # A teardown, a user's stop or an edit may have come meanwhile: decide again, with
        # this key still held, so that no other launch takes the slot first.
        return await reconcile(ctx, spec.name)
    # a log never stops a launch; log probes read this attempt's output only
    log_path, log_offset = open_log(store.write_faults, ctx.run_dir / spec.log)
    for launched in list(store.unidentified):  # the launch before this one, by now exec'd
        alive = store.status[launched].alive
        store.identified(launched, ctx.backend.identity(launched) if alive else None)
    attempt = store.launching(spec.name, log_offset=log_offset)
    ctx.prober.forget(spec.name)
    restarts = _restart_count(ctx, spec)
    launch = LaunchSpec(
        name=spec.name,
        node=spec.node,
        node_ip=spec.node_ip,
        argv=restart_count_in(spec.argv, restarts),
        # srun_export_env travels like env: in the srun client's environment (never argv)
        env=with_restart_count(
            {**dict(spec.env), **dict(spec.export_env), "SRTR_RUN_DIR": ctx.run_dir_path},
            restarts,
        ),
        log_path=log_path,
        attempt=attempt,
        preamble=spec.preamble,
        shell=spec.shell,
        container=spec.container,
        cpus_per_task=spec.cpus_per_task,
        cpu_bind=spec.cpu_bind,
        srun_options=dict(spec.srun_options),
        export_env=dict(spec.export_env),
        stop_grace_seconds=spec.stop_grace_seconds,
        memory_limit=spec.memory_limit,
    )
    if limit > 0:
        ctx.launches.begin(spec.name)
        ctx.spawn(_await_launch(ctx, spec, launch))
        return None
    try:
        pid = await ctx.backend.launch(launch)
    except LaunchError as exc:
        _launch_failed(ctx, spec, exc)
        return None
    _launched(ctx, spec, pid)
    return None


async def _await_launch(ctx: Ctx, spec: InstanceSpec, launch: LaunchSpec) -> None:
    """A launch in flight (`_launch`). Its answer is applied in the same step as its end: no
    reconcile ever sees the instance out of flight and not yet launched (or failed)."""
    try:
        pid = await ctx.backend.launch(launch)
    except LaunchError as exc:
        _launch_failed(ctx, spec, exc)
    except asyncio.CancelledError:
        raise  # the job is over (`manager.run`): the backend's close stops what it started
    except Exception:  # a backend bug, as `manager.process_one` treats a reconcile's
        log.exception("launch of %s failed", spec.name)
        ctx.queue.add_rate_limited(instance_key(spec.name))  # still Pending: tried again
    else:
        _launched(ctx, spec, pid)
    finally:
        ctx.launches.end(spec.name)
        if ctx.store.job.teardown_requested:
            wake(ctx, TEARDOWN)  # it waits for every launch in flight


def _launch_failed(ctx: Ctx, spec: InstanceSpec, exc: LaunchError) -> None:
    if isinstance(exc, NodeLostError):
        _lost_at_launch(ctx, spec, exc)
        return
    ctx.store.launch_failed(spec.name, str(exc))
    ctx.queue.add(instance_key(spec.name))
    wake(ctx, JOB)
    _wake_gang(ctx, spec)


def _lost_at_launch(ctx: Ctx, spec: InstanceSpec, exc: NodeLostError) -> None:
    """Its node is lost (a later stage's member, or a restart, on a node lost meanwhile):
    the instance is lost with it, as its members that ran there were, and waits for a
    spare as they do (`replacement`). Not an exit with code 127: its restart policy would
    retry it on the dead node at once and for ever."""
    extra = {} if exc.fenced_in is None else {"fenced_in": f"{exc.fenced_in:.3f}"}
    attempt = ctx.store.status[spec.name].attempt
    observe(
        ctx, Observation(ObservationKind.LOST, spec.name, attempt, message=str(exc), extra=extra)
    )
    _wake_gang(ctx, spec)


def _wake_gang(ctx: Ctx, spec: InstanceSpec) -> None:
    """A pool restarting as a whole waits for its members' launches in flight."""
    if spec.pool is not None and spec.pool in ctx.store.gangs:
        ctx.queue.add(gang_key(spec.pool))


def _launched(ctx: Ctx, spec: InstanceSpec, pid: int) -> None:
    store = ctx.store
    # The identity is read at the next launch (or the instance's next reconcile): reading
    # /proc/<pid>/stat at once waits for the child's exec to finish (the kernel's exec
    # lock), which it does on another core meanwhile. Not later than that: the guard kills
    # only what state.json identifies, so an attempt must not stay unidentified for long.
    store.launched(spec.name, pid=pid, identity=None)
    if spec.probe is None:
        ctx.queue.add("exporters")  # ready at launch: its metrics become a scrape target
    ctx.queue.add(instance_key(spec.name))  # dead already: decide; alive: identify
    if spec.probe is not None:
        ctx.queue.add(probe_key(spec.name))
    elif spec.liveness is not None:
        ctx.queue.add(liveness_key(spec.name))  # no readiness: liveness counts from launch
    _wake_deferred_probes(ctx, spec)
    if len(ctx.launches) <= (spec.name in ctx.launches):
        # The last launch in flight wakes the job: its reconcile looks at every instance,
        # and once per answer it was most of a 10,000-node stage's launch. An answer in
        # flight still ends in this step or in `_launch_failed`, which both queue it. At
        # once, when it did not run at once within the pace: likely a stage's end.
        wake_first(ctx, JOB)
    if spec.pool:
        wake(ctx, pool_key(spec.pool))
    _wake_gang(ctx, spec)


def _restart_count(ctx: Ctx, spec: InstanceSpec) -> int:
    """How many times the instance was restarted; for a member of a pool restarted as a
    whole, its pool's restarts, which a spare that replaced a lost member shares too."""
    gang_ = ctx.store.gangs.get(spec.pool) if spec.pool is not None else None
    if gang_ is not None and health_decisions.gang_scoped(spec):
        return gang_.restarts
    return ctx.store.status[spec.name].restarts


def restart_count_in(argv: tuple[str, ...], restarts: int) -> tuple[str, ...]:
    """`{restart_count}` is how many times the instance (or its pool) was restarted: only
    known at launch, so `expand` leaves it as written."""
    if not any("{restart_count}" in a for a in argv):
        return argv
    return tuple(a.replace("{restart_count}", str(restarts)) for a in argv)


def with_restart_count(env: dict[str, str], restarts: int) -> dict[str, str]:
    """The launch env with SRTR_RESTART_COUNT, and `{restart_count}` rendered in its values."""
    count = str(restarts)
    if any("{restart_count}" in v for v in env.values()):
        env = {k: v.replace("{restart_count}", count) for k, v in env.items()}
    return {**env, "SRTR_RESTART_COUNT": count}


def _wake_deferred_probes(ctx: Ctx, spec: InstanceSpec) -> None:
    """`with_workers` probes wait for every launch of their stage: once the last member has
    launched, their probes may start."""
    store = ctx.store
    if spec.stage != "workers":
        return  # only the workers stage has deferred members (cheap for big pool stages)
    stage = next((s for s in store.desired.stages if s.name == spec.stage), None)
    if stage is None or not store.specs[stage.instances[0]].deferred_probe:
        return  # expand puts the with_workers instances first: none here
    deferred = list(itertools.takewhile(lambda n: store.specs[n].deferred_probe, stage.instances))
    if not decisions.deferred_probe_waits(stage, store.status):
        for name in deferred:
            ctx.queue.add(probe_key(name))
