"""Typed transitions of an instance's health and of a pool's gang restart.

Readiness after the gate (a Ready instance whose probe fails `failure_threshold` times in a
row is NotReady until it passes again), liveness (failures in a row, then `Unhealthy` and a
stop whose exit is a failure), and the gang restart of a pool whose owner has
`restart.scope: pool` (every member held, stopped, and relaunched together). Like
`transitions.py`: each checks, writes, records its event and condition; none enqueues.
"""

from __future__ import annotations

from collections.abc import Sequence

from srtr.reconciler.clock import Clock
from srtr.resources.objects import DesiredState
from srtr.store.status import GangStatus, InstanceStatus, Phase, UserAction
from srtr.store.store_base import StoreBase


def reset_health(status: InstanceStatus) -> None:
    """A new attempt begins: nothing of the previous one's health carries over."""
    status.readiness_failures = 0
    status.not_ready = False
    status.liveness_failures = 0
    status.liveness_message = ""
    status.next_liveness_at = None
    status.liveness_failed = False
    status.readiness_on_node = status.liveness_on_node = False


class HealthTransitions(StoreBase):
    """Health transitions, mixed into `Store`."""

    def __init__(self, desired: DesiredState, clock: Clock) -> None:
        super().__init__(desired, clock)
        # Pools with `restart.scope: pool`, by name, once one of them first failed.
        self.gangs: dict[str, GangStatus] = {}

    # -- readiness after the gate --------------------------------------------------------
    def readiness_watched(self, name: str, *, ok: bool, message: str) -> bool:
        """One readiness attempt of a Ready (or NotReady) instance after its gate. Returns
        whether it flipped: NotReady after `failure_threshold` failures in a row, Ready
        again at the first pass. Either way the next attempt is due an interval on."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert spec.probe is not None
        status.next_probe_at = self.clock.now() + spec.probe.interval_seconds
        failures = 0 if ok else status.readiness_failures + 1
        return self.readiness_reported(name, ok=ok, failures=failures, message=message)

    def readiness_reported(self, name: str, *, ok: bool, failures: int, message: str) -> bool:
        """Readiness after the gate, as `failures` in a row (0: it passed) say; returns
        whether the instance flipped (NotReady at the threshold, Ready at a pass)."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert spec.probe is not None
        status.readiness_failures = failures
        status.probe_message = "" if ok else message
        if ok and status.not_ready:
            status.not_ready = False
            self.set_phase(name, Phase.READY)
            self.set_condition(status.conditions, "Ready", True, "ProbePassed", message)
            self.record(f"instance/{name}", "Ready", f"ready again: {message}")
            return True
        if ok or status.not_ready or failures < spec.probe.failure_threshold:
            return False
        status.not_ready = True
        self.set_phase(name, Phase.RUNNING)
        self.set_condition(status.conditions, "Ready", False, "ProbeFailing", message)
        self.record(
            f"instance/{name}",
            "NotReady",
            f"{failures} readiness probe failures in a row: {message}",
            warning=True,
        )
        return True

    def watched_on_node(self, name: str, kind: str) -> None:
        """The instance's node runs its `kind` probe (`liveness` or `readiness`) from now on,
        and reports only its transitions."""
        self.touch(name)
        status = self.status[name]
        if kind == "liveness":
            status.liveness_on_node = True
        else:
            status.readiness_on_node = True

    # -- liveness ------------------------------------------------------------------------
    def liveness_started(self, name: str) -> None:
        self.touch(name)
        self.status[name].liveness_in_flight = True

    def liveness_returned(self, name: str, of: InstanceStatus) -> None:
        """The liveness attempt started for status `of` returned (see `probe_returned`)."""
        self.touch(name)
        if self.status.get(name) is of:
            of.liveness_in_flight = False

    def liveness_result(self, name: str, *, ok: bool, message: str) -> int:
        """One liveness attempt's outcome; returns the failures in a row. The next attempt
        is due an interval from now."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert spec.liveness is not None
        status.next_liveness_at = self.clock.now() + spec.liveness.interval_seconds
        status.liveness_failures = 0 if ok else status.liveness_failures + 1
        if message != status.liveness_message:
            status.liveness_message = "" if ok else message
            self.changed()
        return status.liveness_failures

    def liveness_reported(self, name: str, *, failures: int, message: str) -> None:
        """The node reports the liveness probe failed `failures` times in a row."""
        self.touch(name)
        status = self.status[name]
        status.liveness_failures = failures
        status.liveness_message = message
        self.unhealthy(name, message)

    def unhealthy(self, name: str, message: str) -> None:
        """`failure_threshold` liveness failures in a row: an `Unhealthy` warning; srtr stops
        the attempt, and its exit is a failure (`LivenessFailed`)."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert spec.liveness is not None
        status.liveness_failed = True
        self.set_condition(status.conditions, "Ready", False, "LivenessFailed", message)
        self.record(
            f"instance/{name}",
            "Unhealthy",
            f"liveness probe failed {status.liveness_failures} time(s) in a row "
            f"({spec.liveness.describe(spec.node_ip)}): {message}; stopping it",
            warning=True,
        )

    # -- dependents that restart with their dependency ------------------------------------
    def dependency_restart(self, name: str, on: str) -> None:
        """The dependency `on` of the instance restarted (`depends_on` with `restart: true`):
        a planned restart, at no cost to its budget, whose launch waits until the dependency's
        condition holds again."""
        self.touch(name)
        status = self.status[name]
        status.user_action = UserAction.RESTART
        status.restart_reason = f"its dependency services[{on}] restarted"
        self.record(
            f"instance/{name}",
            "DependencyRestarted",
            f"services[{on}] restarted (depends_on restart: true): restarting it once its "
            "condition holds again; no restart budget spent",
        )

    # -- gang restarts of a pool -----------------------------------------------------------
    def gang(self, pool: str) -> GangStatus:
        return self.gangs.setdefault(pool, GangStatus())

    def gang_begin(
        self, pool: str, *, first: str, why: str, limit: int, window: float, window_start: float
    ) -> None:
        """A member of `pool` failed (`first`, `why`): the pool restarts as a whole. Every
        member that ran is held for it; the gang controller stops the live ones."""
        gang = self.gang(pool)
        while gang.restart_times and gang.restart_times[0] <= window_start:
            gang.restart_times.popleft()
        gang.restart_times.append(self.clock.now())
        gang.restarts += 1
        gang.stopping = True
        gang.next_start_at = None
        gang.first_failure = f"{first} {why}"
        held = self._hold_members(pool)
        self.record(
            f"pool/{pool}",
            "PoolRestarting",
            f"{first} {why}; stopping the pool's {held} instance(s), then relaunching them: "
            f"restart {len(gang.restart_times)} of at most {limit} per {window:g}s",
            warning=True,
        )

    def _hold_members(self, pool: str) -> int:
        members = [n for n in self.instances_of_pool(pool) if n not in self.removing]
        held = 0
        for name in members:
            status = self.status[name]
            if status.attempt < 0 or status.phase is Phase.LOST:
                continue  # never launched (its own launch comes), or gone with its node
            status.gang_held = True
            held += 1
            if not status.alive:
                self.gang_hold(name)  # ended already: the failed one, one that finished first
        return held

    def gang_hold(self, name: str) -> None:
        """The member's attempt ended (or had ended): it waits in BackOff, with no start
        time of its own, for its pool's relaunch."""
        self.touch(name)
        status = self.status[name]
        status.gang_held = True
        status.next_start_at = None
        self.set_phase(name, Phase.BACKOFF)

    def gang_backing_off(self, pool: str, *, start_at: float, delay: float) -> None:
        """Every member of the pool is stopped: it relaunches at `start_at`."""
        gang = self.gang(pool)
        gang.stopping = False
        gang.next_start_at = start_at
        self.record(
            f"pool/{pool}", "PoolBackOff", f"every member stopped; relaunching in {delay:.2f}s"
        )

    def gang_relaunch(self, pool: str, members: Sequence[str]) -> None:
        """The backoff is over: the held `members` start again now, in this order."""
        gang = self.gang(pool)
        gang.next_start_at = None
        now = self.clock.now()
        for name in members:
            status = self.status[name]
            status.gang_held = False
            status.gang_restart = True
            status.next_start_at = now
        self.record(
            f"pool/{pool}",
            "PoolRelaunching",
            f"relaunching {len(members)} instance(s) (pool restart {gang.restarts})",
        )

    def gang_gave_up(self, pool: str, *, first: str, why: str, code: int, limit: int) -> None:
        """The pool failed again with its budget spent: Failed. Its live members are
        stopped (and end Stopped); the one that failed is Failed."""
        gang = self.gang(pool)
        gang.failed = True
        gang.stopping = True
        gang.next_start_at = None
        gang.failed_code = code or 1
        gang.first_failure = f"{first} {why}"
        for name in self.instances_of_pool(pool):
            status = self.status[name]
            if status.alive:
                status.gang_held = True
        self.record(
            f"pool/{pool}",
            "PoolFailed",
            f"{first} {why}; restart budget spent ({len(gang.restart_times)} pool restart(s), "
            f"at most {limit}): the pool is Failed",
            warning=True,
        )
