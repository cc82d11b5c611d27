"""Pure decisions of the controllers: values in, a frozen outcome out.

A controller reads the store, calls one of these, and applies the outcome through the store's
transitions and the backend ("plan, then act"). Nothing here imports a backend, asyncio or
the store: statuses are read, never written, and time and randomness come in as arguments,
so each decision is tested with plain values (tests/controllers/test_decisions.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from srtr.resources.node_setup import step_text
from srtr.resources.objects import InstanceKind, InstanceSpec, Stage
from srtr.store.status import FINISHED, InstanceStatus, Phase, UserAction

# --- after an instance's attempt ended ---------------------------------------------------------


@dataclass(frozen=True)
class RestartNow:
    """A user asked for a restart: start again at once, outside backoff and budget."""


@dataclass(frozen=True)
class Finish:
    """Done for good: `phase` is Stopped (it was being stopped), Succeeded or Failed."""

    phase: Phase


@dataclass(frozen=True)
class GiveUp:
    """The restart budget is spent: `restarts` restarts since `window_start`."""

    restarts: int
    window_start: float
    code: int


@dataclass(frozen=True)
class Restart:
    """Start again at `start_at` (`delay` from now), next backoff exponent `backoff_index`.

    `restarts` counts the restarts since `window_start` so far, this one not included.
    """

    delay: float
    start_at: float
    backoff_index: int
    restarts: int
    window_start: float
    code: int


ExitDecision = RestartNow | Finish | GiveUp | Restart


def after_exit(
    spec: InstanceSpec,
    status: InstanceStatus,
    *,
    now: float,
    jitter: float,
    tearing_down: bool,
) -> ExitDecision:
    """What follows the end of the instance's current attempt.

    Args:
        spec: the instance's spec (restart policy, kind).
        status: its status; `exit_code` None (unknown) counts as 1.
        now: the current (monotonic) time.
        jitter: the factor applied to the backoff (about 0.8..1.2).
        tearing_down: the job is being torn down.

    Returns:
        RestartNow for a user's restart; Finish(Stopped) when it was being stopped (not
        for a failed liveness probe: that stop is a failure);
        Finish(Succeeded/Failed) when its policy does not restart it (a benchmark never
        restarts); GiveUp when `max_restarts` restarts happened within `window_seconds`;
        otherwise Restart, with the backoff doubled from `backoff_seconds` up to
        `max_backoff_seconds` and reset after a run of `reset_after_seconds`.
    """
    code = status.exit_code if status.exit_code is not None else 1
    if status.user_action == UserAction.RESTART and not tearing_down:
        return RestartNow()
    if tearing_down or (status.stop_sent_at is not None and not status.liveness_failed):
        return Finish(Phase.STOPPED)
    # Stopped because its liveness probe failed: a failure, whatever its exit code.
    failed = code != 0 or status.liveness_failed
    policy = spec.restart
    restart = policy.policy == "always" or (policy.policy == "on-failure" and failed)
    if not restart or spec.kind is InstanceKind.BENCHMARK:
        return Finish(Phase.FAILED if failed else Phase.SUCCEEDED)
    window_start = now - policy.window_seconds
    # restart_times is in time order, so the ones inside the window are its tail
    recent = sum(1 for t in status.restart_times if t > window_start)
    if recent >= policy.max_restarts:
        return GiveUp(restarts=recent, window_start=window_start, code=code)
    index = status.backoff_index
    if status.started_at is not None and now - status.started_at >= policy.reset_after_seconds:
        index = 0  # it ran stably: forgive earlier crashes
    base = policy.backoff_seconds * (2 ** min(index, 32))
    delay = min(base * jitter, policy.max_backoff_seconds)
    return Restart(
        delay=delay,
        start_at=now + delay,
        backoff_index=index + 1,
        restarts=recent,
        window_start=window_start,
        code=code,
    )


# --- the job: launch stages and its end -----------------------------------------------------------

Specs = Mapping[str, InstanceSpec]
Statuses = Mapping[str, InstanceStatus]


@dataclass(frozen=True)
class StageStep:
    """What the launch stages need now.

    `activate`: instances to start now, in stage order (the stage that begins, and members a
    live edit added to stages that already passed). `started`: (number, stage) of the stage
    that begins now. `passed`: (number, name) of the stages that are up now. `all_up`: every
    stage is up, so the job runs.
    """

    activate: tuple[str, ...] = ()
    started: tuple[int, Stage] | None = None
    passed: tuple[tuple[int, str], ...] = ()
    all_up: bool = False
    fleet: Stage | None = None  # every member is up; the stage waits on its fleet gate
    # Members a live edit added to stages that had passed (a subset of `activate`), and late
    # members that are up now: they no longer hold later stages.
    late: tuple[str, ...] = ()
    settled: tuple[str, ...] = ()


def stage_done(spec: InstanceSpec, status: InstanceStatus) -> bool:
    """Whether the instance lets its stage pass: ready, finished well enough, or a benchmark
    that started (the benchmark is the last stage; the job ends with it).

    One that ended for good before passing its probe never does: it fails the stage gate
    (`stage_gate`)."""
    if spec.kind is InstanceKind.BENCHMARK:
        return status.attempt >= 0
    if spec.kind is InstanceKind.SETUP:
        return status.phase is Phase.SUCCEEDED  # a clone or build passes only by exiting 0
    if status.phase in FINISHED:
        if exited_unready(spec, status):
            return False
        return not spec.critical or status.phase is Phase.SUCCEEDED
    return status.alive and status.ready


def next_stage(
    stages: Sequence[Stage],
    specs: Specs,
    statuses: Statuses,
    passed: AbstractSet[str],
    fleets_passed: AbstractSet[str] = frozenset(),
) -> StageStep:
    """Walk the stages in order: the first one not up yet begins, or is waited for.

    A stage with a fleet gate (`Stage.fleet`) is up once its members are and its name is in
    `fleets_passed`; until then the step names it in `fleet`.

    Members a live edit adds to stages that passed (a pool grown onto new nodes) start in
    the same order as the first launch: a later stage's new members (the new riders) wait
    until the earlier stages' new members (the new owners) are up (`InstanceStatus.late`).
    """
    activate: list[str] = []
    late: list[str] = []
    settled: list[str] = []
    passing: list[tuple[int, str]] = []
    held = False  # a late member of an earlier stage is not up yet

    def step(
        started: tuple[int, Stage] | None = None, fleet: Stage | None = None, all_up: bool = False
    ) -> StageStep:
        return StageStep(
            tuple(activate),
            started,
            tuple(passing),
            all_up=all_up,
            fleet=fleet,
            late=tuple(late),
            settled=tuple(settled),
        )

    for number, stage in enumerate(stages, 1):
        pending = [n for n in stage.instances if not statuses[n].activated]
        if stage.name in passed:
            if not held:  # else its new members wait for the earlier stages' new ones
                activate += pending
                late += pending
                held = _settle_late(stage, specs, statuses, settled) or bool(pending)
            continue
        if held:
            return step()
        if pending:
            activate += pending
            return step(started=(number, stage))
        if not all(stage_done(specs[n], statuses[n]) for n in stage.instances):
            return step()
        if stage.fleet is not None and stage.name not in fleets_passed:
            return step(fleet=stage)
        passing.append((number, stage.name))
    return step(all_up=not held)


def _settle_late(stage: Stage, specs: Specs, statuses: Statuses, settled: list[str]) -> bool:
    """Add the stage's late members that are up, or ended for good, to `settled` (no gate is
    open to fail the job for one that ended: holding would stop the job from ever ending);
    whether any late member is still on its way."""
    waiting = False
    for name in stage.instances:
        status = statuses[name]
        if not status.late:
            continue
        if stage_done(specs[name], status) or status.phase in FINISHED:
            settled.append(name)
        else:
            waiting = True
    return waiting


# --- the stage gate (srtctl's readiness gate) ----------------------------------------------------


def owner_text(spec: InstanceSpec) -> str:
    """Who the instance belongs to, as messages name it: `services[x]`, `roles.agg worker 0`."""
    if spec.kind is InstanceKind.WORKER:
        return f"roles.{spec.service} worker {spec.index}"
    return "frontend" if spec.kind is InstanceKind.FRONTEND else f"services[{spec.service}]"


def readiness_text(spec: InstanceSpec) -> str:
    """srtctl's `describe()` of a readiness probe, with the address: `tcp 10.0.0.2:9000,
    timeout=5s`."""
    assert spec.probe is not None
    return f"{spec.probe.describe(spec.node_ip)}, timeout={spec.probe.timeout_seconds:g}s"


def exited_before_ready(spec: InstanceSpec, status: InstanceStatus) -> str:
    """srtctl's message for an instance that exited before its readiness probe passed."""
    code = "unknown" if status.exit_code is None else status.exit_code
    return (
        f"{owner_text(spec)} exited with code {code} on {spec.node} before its readiness "
        f"probe passed ({readiness_text(spec)}); see {spec.log}"
    )


def not_ready_within(spec: InstanceSpec) -> str:
    """srtctl's message for an instance that did not pass its probe within its timeout."""
    assert spec.probe is not None
    return (
        f"{owner_text(spec)} on {spec.node} was not ready within "
        f"{spec.probe.timeout_seconds:g}s ({readiness_text(spec)}); see {spec.log}"
    )


def exited_unready(spec: InstanceSpec, status: InstanceStatus) -> bool:
    """The instance ended for good before passing its readiness probe: it has a probe, it
    was launched, its restart policy does not bring it back (Succeeded or Failed, whatever
    the code, as srtctl), and its last attempt never got ready."""
    return (
        spec.probe is not None
        and spec.kind is not InstanceKind.BENCHMARK
        and status.attempt >= 0
        and status.phase in (Phase.SUCCEEDED, Phase.FAILED)
        and not status.passed_readiness
        and not (spec.run_to_completion and status.phase is Phase.SUCCEEDED)  # an init's end
    )


# Exit codes of a program that never ran: the shell's (and nsenter's, env's) "command not
# found" and "cannot execute"; srtr's own for a launch the backend could not start at all.
NOT_FOUND, NOT_EXECUTABLE = 127, 126


_NEVER_RAN = frozenset((NOT_FOUND, NOT_EXECUTABLE))


def could_not_start(spec: InstanceSpec, status: InstanceStatus) -> bool:
    """The instance ended for good and its program never ran: its launch failed (no such
    program, a dead agent: LaunchFailed, code 127) or it exited with 127 or 126, as a shell
    does for a missing or non-executable program. Setup steps and the benchmark are judged
    by their own rules."""
    return (
        status.exit_code in _NEVER_RAN  # first: what is rarest
        and status.phase in (Phase.SUCCEEDED, Phase.FAILED)
        and status.attempt >= 0
        and spec.kind not in (InstanceKind.BENCHMARK, InstanceKind.SETUP)
    )


def could_not_start_text(spec: InstanceSpec, status: InstanceStatus) -> str:
    """Why the instance never ran, naming its command and its log."""
    if status.launch_error:
        why = f"could not be started on {spec.node}: {status.launch_error}"
    else:
        what = "was not found" if status.exit_code == NOT_FOUND else "could not be executed"
        why = f"exited with code {status.exit_code} on {spec.node} at once: its program {what}"
    command = " ".join(spec.argv)
    if len(command) > 80:
        command = command[:77] + "..."
    return f"{owner_text(spec)} {why} (command: {command}); see {spec.log}"


def unstartable(specs: Specs, statuses: Statuses, desired: AbstractSet[str]) -> str | None:
    """Why the job fails because a service cannot start at all, or None: every desired
    instance of one service never ran (`could_not_start`), critical or not. srtctl lets a
    non-critical service without a probe die silently; a service none of
    whose instances could start is a broken recipe or install, not a running job."""
    # The job's reconcile asks this on every change: one pass that keeps only the few
    # instances that could not start; their services' other instances are looked at then.
    failing: dict[str, list[str]] = {}
    for name, status in statuses.items():  # no lookup per instance (80,000 a look)
        if status.exit_code in _NEVER_RAN and name in desired:
            if could_not_start(specs[name], status):
                failing.setdefault(specs[name].service, []).append(name)
    if not failing:
        return None
    started = {
        specs[n].service
        for n in desired
        if specs[n].service in failing
        and specs[n].kind not in (InstanceKind.BENCHMARK, InstanceKind.SETUP)
        and not could_not_start(specs[n], statuses[n])
    }
    for service, names in sorted(failing.items()):
        if service not in started:
            first = sorted(names)[0]
            return could_not_start_text(specs[first], statuses[first])
    return None


def open_stage(
    stages: Sequence[Stage], statuses: Statuses, passed: AbstractSet[str]
) -> Stage | None:
    """The stage whose gate is open: the first one not passed, once it has begun (every
    member activated); None when every stage passed or the next one has not begun."""
    for stage in stages:
        if stage.name in passed:
            continue
        return stage if all(statuses[n].activated for n in stage.instances) else None
    return None


@dataclass(frozen=True)
class Gate:
    """The verdict on an open stage gate.

    `failed`: the instance that fails it, and `reason` in srtctl's words; `timed_out` tells
    a readiness timeout from an exit. Otherwise `wake_in`: seconds until the next member's
    readiness deadline (None: no deadline to wait for).
    """

    failed: str | None = None
    reason: str = ""
    timed_out: bool = False
    wake_in: float | None = None
    kill: bool = False  # SIGKILL `failed` now: a setup step that outlived its timeout


def stage_gate(
    stage: Stage, specs: Specs, statuses: Statuses, *, started_at: float, now: float
) -> Gate:
    """srtctl's stage gate, for every probed member of the open `stage` (begun at
    `started_at`): one that ended for good before passing its probe fails it, and so does
    one not ready `timeout_seconds` after the stage began (restarts do not reset that
    clock). Critical or not, either fails the job. Members without a probe are ready once
    launched; the benchmark is not gated. A member whose program never ran
    (`could_not_start`: its launch failed, or it exited with 127/126) fails it too, probe or
    not, with a message that names its command."""
    members = [(specs[n], statuses[n]) for n in stage.instances]
    for spec, status in members:
        never_ran = could_not_start(spec, status)
        if never_ran and status.launch_error:  # never started: say why, not "exited"
            return Gate(failed=spec.name, reason=could_not_start_text(spec, status))
        if exited_unready(spec, status):  # srtctl's words for an exit before the probe
            return Gate(failed=spec.name, reason=exited_before_ready(spec, status))
        if never_ran:  # no probe: srtctl would count it up
            return Gate(failed=spec.name, reason=could_not_start_text(spec, status))
    wake = setup_gate(members, now=now)
    if wake.failed is not None:
        return wake
    return _readiness_gate(members, started_at=started_at, now=now, wake=wake.wake_in)


def setup_step_failed(spec: InstanceSpec, status: InstanceStatus) -> str:
    """srtctl's message for a clone, build or setup step that ended badly."""
    code = "unknown" if status.exit_code is None else status.exit_code
    how = f"signal {status.exit_signal}" if status.exit_signal else f"exit {code}"
    return f"{owner_text(spec)} {step_text(spec)} failed ({how}); see {spec.log}"


def setup_step_timed_out(spec: InstanceSpec) -> str:
    assert spec.run_timeout_seconds is not None
    return (
        f"{owner_text(spec)} {step_text(spec)} timed out after "
        f"{spec.run_timeout_seconds:g}s and was killed; see {spec.log}"
    )


def setup_gate(members: Sequence[tuple[InstanceSpec, InstanceStatus]], *, now: float) -> Gate:
    """The setup steps (clone, build, setup) among `members`: one that ended other than with exit
    0 fails the gate; one still running `run_timeout_seconds` after its launch fails it and
    is killed. Otherwise `wake_in` is the time to the nearest step deadline."""
    wake: float | None = None
    for spec, status in members:
        if spec.kind is not InstanceKind.SETUP:
            continue
        if status.phase in FINISHED and status.phase is not Phase.SUCCEEDED:
            return Gate(failed=spec.name, reason=setup_step_failed(spec, status))
        if not status.alive or spec.run_timeout_seconds is None or status.started_at is None:
            continue
        left = status.started_at + spec.run_timeout_seconds - now
        if left <= 0:
            return Gate(failed=spec.name, reason=setup_step_timed_out(spec), kill=True)
        wake = left if wake is None else min(wake, left)
    return Gate(wake_in=wake)


def _readiness_gate(
    members: Sequence[tuple[InstanceSpec, InstanceStatus]],
    *,
    started_at: float,
    now: float,
    wake: float | None,
) -> Gate:
    for spec, status in members:
        if spec.probe is None or spec.kind in (InstanceKind.BENCHMARK, InstanceKind.SETUP):
            continue
        if status.phase in FINISHED or (status.alive and status.ready):
            continue
        left = started_at + spec.probe.timeout_seconds - now
        if left <= 0:
            return Gate(failed=spec.name, reason=not_ready_within(spec), timed_out=True)
        wake = left if wake is None else min(wake, left)
    return Gate(wake_in=wake)


def deferred_probe_waits(stage: Stage, statuses: Statuses) -> bool:
    """A `with_workers` instance's probe waits until every member of its stage (the workers
    included) has been launched: True while one is still to launch."""
    return any(
        statuses[n].attempt < 0 or statuses[n].phase is Phase.PENDING for n in stage.instances
    )


def readiness_deadline(
    spec: InstanceSpec, status: InstanceStatus, *, gate_started_at: float | None
) -> float:
    """When the instance must have passed its probe: `timeout_seconds` after its stage
    began while that stage's gate is open (`gate_started_at`), else (after the gate, e.g. a
    restart later on) after its current attempt began."""
    assert spec.probe is not None
    start = gate_started_at if gate_started_at is not None else status.started_at
    assert start is not None
    return start + spec.probe.timeout_seconds


def critical_failure(
    specs: Specs, statuses: Statuses, desired: AbstractSet[str], *, spares: bool
) -> str | None:
    """Why the job fails because of a critical instance, or None.

    A critical instance fails the job when it Failed, or when it was Lost and no spare node
    can take its place (`replace_lost` with `spares` left); of several, the one that ended
    first. Instances an edit or a replacement dropped (not in `desired`) no longer count.
    """
    # The job's reconcile asks this on every change: one pass, no sort of every instance.
    first: tuple[float, str] | None = None
    ended = (Phase.LOST, Phase.FAILED)  # looked up once, not twice per instance
    for name, status in statuses.items():
        if status.phase not in ended:
            continue
        spec = specs[name]
        if name not in desired or not spec.critical:
            continue
        if status.phase is Phase.LOST and spec.replace_lost and spares:
            continue
        if first is None or _ended_at(status) < first[0]:
            first = (_ended_at(status), name)
    if first is None:
        return None
    name = first[1]
    status, spec = statuses[name], specs[name]
    if status.phase is Phase.LOST:
        return f"critical instance {name} was lost with its node {spec.node}"
    how = f"signal {status.exit_signal}" if status.exit_signal else f"code {status.exit_code}"
    return f"critical instance {name} on {spec.node} failed (exit {how}); see {spec.log}"


@dataclass(frozen=True)
class EndJob:
    """The job is over: tear it down with `exit_code` because of `reason`."""

    exit_code: int
    reason: str


def job_end(specs: Specs, statuses: Statuses) -> EndJob | None:
    """Once every stage is up: the job ends when the benchmark finished (its code), or when
    every terminal instance finished: with the code of the first of them that failed (the
    earliest exit; the others often only abort because of it), 0 when none did; otherwise
    it holds (None)."""
    bench = specs.get("benchmark")
    if bench is not None and bench.kind is InstanceKind.BENCHMARK:
        status = statuses["benchmark"]
        if status.phase not in FINISHED:
            return None
        code = status.exit_code if status.exit_code is not None else 1
        return EndJob(code, f"benchmark exited with code {code}")
    terminal = [n for n, s in specs.items() if s.terminal]
    if terminal and all(statuses[n].phase in FINISHED for n in terminal):
        failed = [n for n in terminal if statuses[n].exit_code]
        if not failed:
            return EndJob(0, "terminal service(s) finished (every exit code 0)")
        first = min(failed, key=lambda n: _ended_at(statuses[n]))  # the first of ties
        code = statuses[first].exit_code or 1
        spec = specs[first]
        return EndJob(
            code,
            f"terminal service(s) failed (first failed: {first} on {spec.node}, exit code "
            f"{code}; see {spec.log})",
        )
    return None


def _ended_at(status: InstanceStatus) -> float:
    """When the instance's last attempt ended (monotonic); unknown ones count as last."""
    return status.exited_at if status.exited_at is not None else float("inf")


def rolled_out(statuses: Statuses, desired: Iterable[str]) -> bool:
    """Whether every desired instance runs its current spec: activated, launched (not
    Pending), not waiting for an edit's restart, and up if an edit added it late."""
    for name in desired:
        status = statuses[name]
        if (
            status.user_action is UserAction.RESTART
            or not status.activated
            or status.late
            or status.phase is Phase.PENDING
        ):
            return False
    return True
