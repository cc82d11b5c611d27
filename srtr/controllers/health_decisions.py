"""Pure decisions about health: when a probe is due, and what a pool's failure leads to.

As `decisions.py`: values in, a frozen outcome out; nothing here writes a status or waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from srtr.controllers.decisions import EndJob
from srtr.resources.objects import InstanceKind, InstanceSpec, ProbeKind
from srtr.store.status import GangStatus, InstanceStatus, Phase, UserAction


def liveness_due(spec: InstanceSpec, status: InstanceStatus) -> float | None:
    """When the instance's next liveness attempt is due (monotonic), or None while it is not
    watched yet: `initial_delay_seconds` counts from Ready, or from the launch for a service
    without readiness (the readiness gate is the startup probe)."""
    assert spec.liveness is not None
    if spec.probe is None:
        start = status.started_at
    else:
        # An adopted instance's Ready time is the adoption's (`started_at`).
        start = status.ready_at if status.ready_at is not None else status.started_at
        start = start if status.passed_readiness else None
    if start is None:
        return None
    first = start + spec.liveness.initial_delay_seconds
    return first if status.next_liveness_at is None else max(first, status.next_liveness_at)


def watches_readiness(spec: InstanceSpec) -> bool:
    """Whether readiness keeps being probed after the gate: not a log pattern, which once
    matched stays matched."""
    return spec.probe is not None and spec.probe.kind is not ProbeKind.LOG


def gang_scoped(spec: InstanceSpec) -> bool:
    """An owner of a pool that restarts as a whole (`restart.scope: pool`)."""
    return (
        spec.kind is InstanceKind.OWNER and spec.pool is not None and spec.restart.scope == "pool"
    )


@dataclass(frozen=True)
class Ordinary:
    """Not the pool's business: the instance's own rules decide (a clean exit, a stop)."""


@dataclass(frozen=True)
class Hold:
    """A member stopped for (or ended during) its pool's restart: wait for the relaunch."""


@dataclass(frozen=True)
class RestartPool:
    """The member failed (`why`): restart the whole pool."""

    why: str
    window_start: float


@dataclass(frozen=True)
class FailPool:
    """The member failed (`why`) and the pool's budget is spent: the pool is Failed."""

    why: str
    code: int


GangVerdict = Ordinary | Hold | RestartPool | FailPool


def gang_exit(
    spec: InstanceSpec, status: InstanceStatus, gang: GangStatus | None, *, now: float
) -> GangVerdict:
    """What the end of a gang-scoped member's attempt means for its pool.

    A failure is a non-zero exit (or a signal srtr did not send), a failed liveness probe,
    a launch that failed; with `always`, any exit. An exit while the pool is stopping, or
    of a member srtr held for it, is the pool restart's own doing. A user's restart or stop
    is the user's."""
    if status.gang_held or (gang is not None and gang.stopping):
        return Hold()
    if status.user_action is UserAction.RESTART:
        return Ordinary()
    if status.stop_sent_at is not None and not status.liveness_failed:
        return Ordinary()
    code = status.exit_code if status.exit_code is not None else 1
    failed = code != 0 or status.liveness_failed
    if not failed and spec.restart.policy != "always":
        return Ordinary()
    return _restart_or_fail(spec, gang, failure_text(spec, status), code, now)


def gang_lost(spec: InstanceSpec, gang: GangStatus | None, *, now: float) -> GangVerdict:
    """A member was lost with its node: a failure of the pool, unless it is stopping."""
    if gang is not None and (gang.stopping or gang.failed):
        return Ordinary()
    return _restart_or_fail(spec, gang, f"was lost with its node {spec.node}", 1, now)


def _restart_or_fail(
    spec: InstanceSpec, gang: GangStatus | None, why: str, code: int, now: float
) -> GangVerdict:
    policy = spec.restart
    window_start = now - policy.window_seconds
    times = gang.restart_times if gang is not None else ()
    recent = sum(1 for t in times if t > window_start)
    if (gang is not None and gang.failed) or recent >= policy.max_restarts:
        return FailPool(why=why, code=code)
    return RestartPool(why=why, window_start=window_start)


def failure_text(spec: InstanceSpec, status: InstanceStatus) -> str:
    """How a member failed, as a pool's events name it: `exited with code 1 on node2`."""
    if status.liveness_failed:
        return f"failed its liveness probe on {spec.node} (LivenessFailed)"
    if status.launch_error:
        return f"could not be launched on {spec.node}: {status.launch_error}"
    if status.exit_signal:
        return f"was killed by signal {status.exit_signal} on {spec.node}"
    code = "unknown" if status.exit_code is None else status.exit_code
    return f"exited with code {code} on {spec.node}"


def gang_delay(spec: InstanceSpec, gang: GangStatus, jitter: float) -> float:
    """The backoff before a pool's relaunch: `backoff_seconds`, doubled for each pool
    restart already in the window, capped at `max_backoff_seconds`."""
    policy = spec.restart
    base: float = policy.backoff_seconds * 2 ** min(max(len(gang.restart_times) - 1, 0), 32)
    return min(base * jitter, policy.max_backoff_seconds)


def held_members(members: list[str], statuses: dict[str, InstanceStatus]) -> list[str]:
    """The pool's members waiting in BackOff for its relaunch, in pool order."""
    return [n for n in members if statuses[n].gang_held and statuses[n].phase is Phase.BACKOFF]


def pool_failure(
    gangs: Mapping[str, GangStatus], specs: Mapping[str, InstanceSpec]
) -> EndJob | None:
    """The job fails when a Failed gang-scoped pool is terminal or critical: with its first
    failure's exit code, naming it."""
    for pool, gang in gangs.items():
        if not gang.failed:
            continue
        owners = [s for s in specs.values() if s.pool == pool and s.kind is InstanceKind.OWNER]
        if any(s.terminal or s.critical for s in owners):
            return EndJob(
                gang.failed_code,
                f"pool {pool} failed: restart budget spent ({len(gang.restart_times)} pool "
                f"restart(s)); {gang.first_failure}",
            )
    return None
