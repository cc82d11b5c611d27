"""Instance controller: launch an instance when its stage is active, apply its restart policy.

`reconcile(ctx, name)` is level-triggered: it looks at the instance's spec and status and
takes one step (launch, decide after an exit, wait out a backoff). Stopping during teardown
belongs to `teardown.py`.
"""

from __future__ import annotations

from srtr.backends.base import LaunchError, LaunchSpec, Observation, ObservationKind
from srtr.controllers import teardown
from srtr.controllers.context import JOB, TEARDOWN, Ctx, instance_key, pool_key, probe_key
from srtr.reconciler.store import ALIVE, Phase
from srtr.reconciler.workqueue import Result
from srtr.resources.objects import InstanceKind, InstanceSpec


def observe(ctx: Ctx, obs: Observation) -> None:
    """Backend listener: record what happened, then enqueue everyone who cares."""
    store = ctx.store
    status = store.status.get(obs.name)
    if status is None or obs.attempt != status.attempt:
        return  # a late report about an attempt that is already replaced
    if obs.kind is ObservationKind.STARTED:
        status.step = obs.step or status.step
        store.changed()
        return
    status.alive = False
    status.exited_attempt = obs.attempt
    status.exit_code = obs.exit_code
    status.exit_signal = obs.signal
    status.exited_at = ctx.clock.now()
    status.history.append(
        {
            "attempt": obs.attempt,
            "exit_code": obs.exit_code,
            "signal": obs.signal,
            "at": round(ctx.clock.wall(), 3),
            "message": obs.message,
        }
    )
    spec = store.spec(obs.name)
    how = (
        f"signal {obs.signal}"
        if obs.signal
        else f"code {obs.exit_code}"
        if obs.exit_code is not None
        else "unknown status"
    )
    lost = obs.kind is ObservationKind.LOST
    expected = store.job.teardown_requested or status.stop_sent_at is not None
    store.record(
        f"instance/{obs.name}",
        "NodeLost" if lost else "Exited",
        f"{'lost' if lost else 'exited with ' + how} on {spec.node}"
        + (f": {obs.message}" if lost and obs.message else ""),
        warning=(obs.exit_code != 0 or lost) and not expected,
    )
    store.set_condition(status.conditions, "Ready", False, "NodeLost" if lost else "Exited", how)
    if lost:
        status.phase = Phase.LOST
        ctx.queue.add("replacement")
    ctx.queue.add("exporters")  # an exited instance's targets leave the targets file
    _enqueue_related(ctx, spec)


def _enqueue_related(ctx: Ctx, spec: InstanceSpec) -> None:
    ctx.queue.add(instance_key(spec.name))
    ctx.queue.add(JOB)
    if spec.pool:
        ctx.queue.add(pool_key(spec.pool))
    if ctx.store.job.teardown_requested:
        ctx.queue.add(TEARDOWN)


async def reconcile(ctx: Ctx, name: str) -> Result | None:
    store = ctx.store
    spec = store.specs.get(name)
    if spec is None:
        return None
    status = store.status[name]
    if name in store.removing:
        ctx.queue.add("removal")  # the removal controller owns dropped instances
        return None
    if status.alive:
        if status.user_action and not store.job.teardown_requested:
            return await _stop_for_user(ctx, spec)
        return None
    if status.phase in ALIVE:
        result = _after_exit(ctx, spec)
        ctx.queue.add(JOB)  # the job decides on the instance's new phase
        return result
    if status.phase is Phase.LOST:
        return None
    if store.job.teardown_requested or status.user_action == "stop":
        if status.phase in (Phase.BACKOFF, Phase.PENDING) and status.activated:
            store.set_phase(name, Phase.STOPPED)
        return None
    if status.user_action == "restart" and status.phase is Phase.BACKOFF:
        status.user_action = None
        status.next_start_at = ctx.clock.now()
    if not status.activated:
        return None
    now = ctx.clock.now()
    if status.phase is Phase.PENDING:
        await _launch(ctx, spec)
    elif status.phase is Phase.BACKOFF:
        assert status.next_start_at is not None
        if now < status.next_start_at:
            return Result(requeue_after=status.next_start_at - now)
        await _launch(ctx, spec)
    return None


async def _stop_for_user(ctx: Ctx, spec: InstanceSpec) -> Result | None:
    """SIGTERM for a user's restart/stop; SIGKILL once the instance's grace has passed."""
    wait = await teardown.stop(ctx, spec.name, ctx.clock.now())
    return Result(requeue_after=wait) if wait is not None else None


def _after_exit(ctx: Ctx, spec: InstanceSpec) -> Result | None:
    """The instance's process is gone: finished, stopped, or due for a restart."""
    store = ctx.store
    status = store.status[spec.name]
    code = status.exit_code if status.exit_code is not None else 1
    if status.user_action == "restart" and not store.job.teardown_requested:
        status.user_action = None
        status.next_start_at = ctx.clock.now()
        store.set_phase(spec.name, Phase.BACKOFF)
        return Result(requeue_after=0)
    if store.job.teardown_requested or status.stop_sent_at is not None:
        store.set_phase(spec.name, Phase.STOPPED)
        return None
    policy = spec.restart.policy
    restart = policy == "always" or (policy == "on-failure" and code != 0)
    if not restart or spec.kind is InstanceKind.BENCHMARK:
        store.set_phase(spec.name, Phase.SUCCEEDED if code == 0 else Phase.FAILED)
        return None
    now = ctx.clock.now()
    window = spec.restart.window_seconds
    while status.restart_times and status.restart_times[0] <= now - window:
        status.restart_times.popleft()
    if len(status.restart_times) >= spec.restart.max_restarts:
        store.set_phase(spec.name, Phase.FAILED)
        store.record(
            f"instance/{spec.name}",
            "GaveUp",
            f"restart budget spent: {len(status.restart_times)} restart(s) within "
            f"{window:g}s on {spec.node}; last exit code {code}",
            warning=True,
        )
        return None
    if (
        status.started_at is not None
        and now - status.started_at >= spec.restart.reset_after_seconds
    ):
        status.backoff_index = 0  # it ran stably: forgive earlier crashes
    base = spec.restart.backoff_seconds * (2 ** min(status.backoff_index, 32))
    delay = min(base * ctx.jitter(), spec.restart.max_backoff_seconds)
    status.backoff_index += 1
    status.next_start_at = now + delay
    store.set_phase(spec.name, Phase.BACKOFF)
    store.record(
        f"instance/{spec.name}",
        "BackOff",
        f"exit code {code}; restarting in {delay:.2f}s "
        f"(restart {len(status.restart_times) + 1} of at most "
        f"{spec.restart.max_restarts} per {window:g}s)",
        warning=True,
    )
    return Result(requeue_after=delay)


async def _launch(ctx: Ctx, spec: InstanceSpec) -> None:
    store = ctx.store
    status = store.status[spec.name]
    now = ctx.clock.now()
    attempt = status.attempt + 1
    if attempt > 0:
        status.restarts += 1
        status.restart_times.append(now)
        store.record(
            f"instance/{spec.name}",
            "Restarting",
            f"attempt {attempt} on {spec.node} (restart {status.restarts})",
        )
    log_path = ctx.run_dir / spec.log
    try:
        status.log_offset = log_path.stat().st_size
    except OSError:
        status.log_offset = 0
    status.attempt = attempt
    status.step = None  # the backend reports the new attempt's step once it has one
    status.exit_code = status.exit_signal = None
    status.stop_sent_at = status.next_probe_at = None
    status.kill_sent = status.ready = False
    status.probe_message = ""
    ctx.prober.forget(spec.name)
    launch = LaunchSpec(
        name=spec.name,
        node=spec.node,
        node_ip=spec.node_ip,
        argv=spec.argv,
        env={**dict(spec.env), "SRTR_RUN_DIR": str(ctx.run_dir.resolve())},
        log_path=log_path,
        attempt=attempt,
        preamble=spec.preamble,
        shell=spec.shell,
        container=spec.container,
        cpus_per_task=spec.cpus_per_task,
        cpu_bind=spec.cpu_bind,
        srun_options=dict(spec.srun_options),
    )
    status.started_at = now
    try:
        pid = await ctx.backend.launch(launch)
    except LaunchError as exc:
        status.phase = Phase.STARTING
        status.alive = False
        status.exit_code = 127
        store.record(f"instance/{spec.name}", "LaunchFailed", str(exc), warning=True)
        ctx.queue.add(instance_key(spec.name))
        ctx.queue.add(JOB)
        return
    status.pid = pid
    identity = getattr(ctx.backend, "identity", None)
    status.identity = identity(spec.name) if identity is not None else None
    # A backend that awaits inside launch may already have reported this attempt's exit.
    status.alive = status.exited_attempt != attempt
    status.ready = spec.probe is None
    status.phase = Phase.STARTING if spec.probe else Phase.RUNNING
    if spec.probe is None:
        store.set_condition(status.conditions, "Ready", True, "NoProbe", "ready once launched")
        ctx.queue.add("exporters")  # ready at launch: its metrics become a scrape target
    else:
        store.set_condition(
            status.conditions, "Ready", None, "Probing", spec.probe.describe(spec.node_ip)
        )
    readiness = f"probing {spec.probe.describe(spec.node_ip)}" if spec.probe else "no probe: ready"
    store.record(f"instance/{spec.name}", "Launched", f"on {spec.node} (pid {pid}); {readiness}")
    if not status.alive:
        ctx.queue.add(instance_key(spec.name))
    if spec.probe is not None:
        ctx.queue.add(probe_key(spec.name))
    ctx.queue.add(JOB)
    if spec.pool:
        ctx.queue.add(pool_key(spec.pool))
