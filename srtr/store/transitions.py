"""Typed transitions of one instance's status, from its launch to its end.

Together with `job_transitions.py` (stage activation, the end of the job) and
`edit_transitions.py` (statuses added and dropped by edits) this is the only code that writes
`InstanceStatus`. Each transition checks its preconditions, writes the fields, records its
event and Ready condition, and marks the store changed. None of them enqueues: the calling
controller knows who should look next. Times come from the store's clock unless the caller
decided them (a backoff's start time is part of the decision in `controllers.decisions`).

Lifecycle of one attempt: `launching` (attempt+1) → `launched` or `launch_failed` →
`exited` (from the backend) → `restart_now` | `finished` | `gave_up` | `backing_off`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from srtr.store import causes
from srtr.store.cause_transitions import CauseTransitions
from srtr.store.health_transitions import reset_health
from srtr.store.status import (
    ALIVE,
    FINISHED,
    ExitRecord,
    InstanceStatus,
    Phase,
    UserAction,
)

# A launch the backend refused counts as an exit with the shell's "command not found" code:
# restart policies, critical failures and terminal exit codes treat it like any failed exit.
LAUNCH_FAILED_EXIT_CODE = 127

_REQUESTED = {
    UserAction.RESTART: ("RestartRequested", "restart requested by user"),
    UserAction.STOP: ("StopRequested", "stop requested by user"),
}


class InstanceTransitions(CauseTransitions):
    """Transitions of `InstanceStatus`, mixed into `Store` (with the job's first failure)."""

    def _current(self, name: str, attempt: int) -> InstanceStatus | None:
        status = self.status.get(name)
        if status is None or attempt != status.attempt:
            return None  # a late report about an attempt that is already replaced
        return status

    # -- the backend's observations -----------------------------------------------------------
    def started(self, name: str, *, attempt: int, step: str | None) -> bool:
        """The backend knows the attempt's step (SLURM). False for a stale attempt."""
        self.touch(name)
        status = self._current(name, attempt)
        if status is None:
            return False
        status.step = step or status.step
        self.changed()
        return True

    def exited(
        self,
        name: str,
        *,
        attempt: int,
        exit_code: int | None,
        signal: int | None,
        message: str = "",
        lost: bool = False,
        reason: str = "",
    ) -> bool:
        """The attempt ended (or its node was `lost`): Exited/NodeLost, Ready False.

        The phase stays where it was (the instance controller decides what follows), except
        for a lost node: Lost. `reason` is what ended it when the backend or a controller
        knows (OOMKilled, LivenessFailed). A failure srtr did not cause is a Warning, keeps
        its class in the history, and may be the job's first failure (`job.cause`).
        Returns False, changing nothing, for a stale attempt.
        """
        self.touch(name)
        status = self._current(name, attempt)
        if status is None:
            return False
        status.exited_attempt = attempt
        status.exit_code = exit_code
        status.exit_signal = signal
        status.exited_at = self.clock.now()
        failure = self.failure(
            status, exit_code=exit_code, signal=signal, reported=reason, lost=lost
        )
        planned = (
            status.restart_reason
            if status.user_action is UserAction.RESTART and status.stop_sent_at is not None
            else None
        )
        entry: ExitRecord = {"attempt": attempt, "exit_code": exit_code, "signal": signal}
        entry |= {"at": round(self.clock.wall(), 3), "message": message}
        if planned and not lost:
            entry["planned"] = planned
        if failure:
            entry["reason"] = failure
        status.history.append(entry)
        if failure:
            self.note_failure(name, failure, exit_code=exit_code, signal=signal, message=message)
        self._exit_event(name, exit_code, signal, message, lost, planned, failure)
        if lost:
            status.phase = Phase.LOST
        return True

    def _exit_event(
        self,
        name: str,
        exit_code: int | None,
        signal: int | None,
        message: str,
        lost: bool,
        planned: str | None,
        failure: str | None,
    ) -> None:
        """`exited`'s Exited (or NodeLost) event and Ready condition: a Warning only for a
        `failure`, never for an end srtr caused (a teardown, a planned or a pool's restart;
        a failed liveness probe's stop is a failure, though srtr sent it)."""
        status = self.status[name]
        node = self.specs[name].node
        how = _how(exit_code, signal)
        text = f"{'lost' if lost else 'exited with ' + how} on {node}"
        if failure in causes.REPORTED:
            text += f" ({failure})"
        if planned and not lost:
            text = f"stopped on {node} for a planned restart: {planned} ({how})"
        self.record(
            f"instance/{name}",
            "NodeLost" if lost else "Exited",
            text + (f": {message}" if lost and message else ""),
            warning=failure is not None,
        )
        self.set_condition(status.conditions, "Ready", False, "NodeLost" if lost else "Exited", how)

    # -- launching ----------------------------------------------------------------------------
    def launching(self, name: str, *, log_offset: int) -> int:
        """A new attempt begins (from Pending or BackOff); returns its number.

        Clears what belonged to the previous attempt. A restart is recorded as Restarting;
        one after a crash counts (`restarts`) toward the budget, a planned one (a user's
        restart, a rollout: `planned`) does not.
        """
        self.touch(name)
        status = self.status[name]
        assert status.phase in (Phase.PENDING, Phase.BACKOFF), status.phase
        now = self.clock.now()
        attempt = status.attempt + 1
        if attempt > 0 and status.gang_restart:
            status.restarts += 1  # its pool's restart: counted, on the pool's budget
            self.record(
                f"instance/{name}",
                "Restarting",
                f"pool restart: attempt {attempt} on {self.specs[name].node} "
                f"(restart {status.restarts})",
            )
        elif attempt > 0 and status.planned is not None:
            self.record(
                f"instance/{name}",
                "Restarting",
                f"{status.planned}: attempt {attempt} on {self.specs[name].node}",
            )
        elif attempt > 0:
            status.restarts += 1
            status.restart_times.append(now)
            self.record(
                f"instance/{name}",
                "Restarting",
                f"attempt {attempt} on {self.specs[name].node} (restart {status.restarts})",
            )
        status.planned = None
        status.gang_restart = False
        reset_health(status)
        status.log_offset = log_offset
        status.attempt = attempt
        status.step = None  # the backend reports the new attempt's step once it has one
        status.exit_code = status.exit_signal = None
        status.stop_sent_at = status.next_probe_at = None
        status.kill_sent = False
        status.probe_message = ""
        status.launch_error = None
        status.started_at = now
        return attempt

    def launched(self, name: str, *, pid: int, identity: dict[str, int] | None) -> None:
        """The backend started the attempt: Running (no probe, so Ready) or Starting (probing).

        A backend that awaits inside launch may already have reported the attempt's exit;
        then the instance is not alive and its controller decides at once.
        """
        self.touch(name)
        self.came_alive += 1
        status, spec = self.status[name], self.specs[name]
        status.pid = pid
        status.identity = identity
        if identity is None:
            self.unidentified.add(name)
        if spec.probe is None:
            status.ready_attempt = status.attempt
        status.phase = Phase.STARTING if spec.probe else Phase.RUNNING
        if spec.probe is None:
            self.set_condition(status.conditions, "Ready", True, "NoProbe", "ready once launched")
        else:
            self.set_condition(
                status.conditions, "Ready", None, "Probing", spec.probe.describe(spec.node_ip)
            )
        readiness = (
            f"probing {spec.probe.describe(spec.node_ip)}" if spec.probe else "no probe: ready"
        )
        self.record(f"instance/{name}", "Launched", f"on {spec.node} (pid {pid}); {readiness}")

    def identified(self, name: str, identity: dict[str, int] | None) -> None:
        """What adoption will check of the live attempt (pid and kernel start time), read by
        the backend after the launch rather than in it."""
        self.touch(name)
        self.status[name].identity = identity
        self.unidentified.discard(name)

    def launch_failed(self, name: str, error: str) -> None:
        """The backend could not start the attempt: it ended at once with code 127.

        The phase is Starting, the phase the attempt got to, as for any attempt that ended
        before its controller decided what follows (`exited`).
        """
        self.touch(name)
        status = self.status[name]
        status.phase = Phase.STARTING
        status.exited_attempt = status.attempt
        status.exited_at = self.clock.now()
        status.exit_code = LAUNCH_FAILED_EXIT_CODE
        status.launch_error = error
        self.record(f"instance/{name}", "LaunchFailed", error, warning=True)
        if not self.job.teardown_requested:
            self.note_failure(
                name, causes.LAUNCH_FAILED, exit_code=None, signal=None, message=error
            )

    # -- after an exit ------------------------------------------------------------------------
    def restart_now(self, name: str) -> None:
        """Act on a planned restart (a user's, a rollout's) of a stopped attempt: start again
        at once (BackOff, due now), as a planned launch that costs no restart budget."""
        self.touch(name)
        status = self.status[name]
        assert status.user_action == UserAction.RESTART
        status.user_action = None
        status.planned = status.restart_reason or _REQUESTED[UserAction.RESTART][1]
        status.restart_reason = None
        status.next_start_at = self.clock.now()
        self.set_phase(name, Phase.BACKOFF)

    def relaunch(self, name: str) -> None:
        """A user's restart of an instance that ended for good (Succeeded, Failed, GaveUp,
        Stopped): start it again at once with a fresh restart budget and backoff."""
        self.touch(name)
        status = self.status[name]
        assert status.user_action == UserAction.RESTART
        assert status.phase in FINISHED and status.phase is not Phase.LOST, status.phase
        status.restart_times.clear()
        status.backoff_index = 0
        self.restart_now(name)

    def finished(self, name: str, phase: Phase) -> None:
        """The instance is done for good: Succeeded, Failed or Stopped."""
        self.touch(name)
        assert phase in FINISHED and phase is not Phase.LOST, phase
        self.set_phase(name, phase)

    def gave_up(self, name: str, *, restarts: int, window_start: float, code: int) -> None:
        """The restart budget is spent: Failed, with a GaveUp warning."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        _forget_restarts(status, window_start)
        self.set_phase(name, Phase.FAILED)
        self.record(
            f"instance/{name}",
            "GaveUp",
            f"restart budget spent: {restarts} restart(s) within "
            f"{spec.restart.window_seconds:g}s on {spec.node}; last exit code {code}",
            warning=True,
        )

    def backing_off(
        self,
        name: str,
        *,
        start_at: float,
        delay: float,
        backoff_index: int,
        restarts: int,
        window_start: float,
        code: int,
    ) -> None:
        """The attempt ended and its policy restarts it at `start_at`: BackOff, with a warning."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert status.exited, status.phase
        _forget_restarts(status, window_start)
        status.backoff_index = backoff_index
        status.next_start_at = start_at
        self.set_phase(name, Phase.BACKOFF)
        self.record(
            f"instance/{name}",
            "BackOff",
            f"exit code {code}; restarting in {delay:.2f}s "
            f"(restart {restarts + 1} of at most "
            f"{spec.restart.max_restarts} per {spec.restart.window_seconds:g}s)",
            warning=True,
        )

    # -- readiness ----------------------------------------------------------------------------
    def probe_started(self, name: str) -> None:
        """A probe attempt of the instance is running (no second one until it returns)."""
        self.touch(name)
        self.status[name].probe_in_flight = True

    def probe_returned(self, name: str, of: InstanceStatus) -> None:
        """The probe attempt started for status `of` returned.

        A status that replaced `of` meanwhile (the instance was dropped and added again by
        edits) has probes of its own and is left alone.
        """
        self.touch(name)
        if self.status.get(name) is of:
            of.probe_in_flight = False

    def probe_passed(self, name: str) -> None:
        """The readiness probe passed: Ready (phase and condition), with a Ready event."""
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert spec.probe is not None and status.alive
        now = self.clock.now()
        status.ready_attempt = status.attempt
        status.ready_at = now
        status.probe_message = ""
        status.next_probe_at = now + spec.probe.interval_seconds  # it keeps being watched
        self.set_phase(name, Phase.READY)
        self.set_condition(
            status.conditions, "Ready", True, "ProbePassed", spec.probe.describe(spec.node_ip)
        )
        took = now - (status.started_at or now)
        self.record(
            f"instance/{name}",
            "Ready",
            f"{spec.probe.describe(spec.node_ip)} passed after {took:.1f}s",
        )

    def probe_failed(self, name: str, message: str) -> None:
        """The probe failed with `message`; the next attempt is due one interval from now.

        The Ready condition says why (ProbeFailing) whenever the message changes.
        """
        self.touch(name)
        status, spec = self.status[name], self.specs[name]
        assert spec.probe is not None
        if message != status.probe_message:
            status.probe_message = message
            self.set_condition(status.conditions, "Ready", False, "ProbeFailing", message)
        status.next_probe_at = self.clock.now() + spec.probe.interval_seconds

    def not_ready_in_time(self, name: str, reason: str) -> None:
        """The instance did not pass its probe within its timeout (`reason`): a ProbeFailed
        warning that also gives the last probe attempt's message."""
        self.touch(name)
        status = self.status[name]
        last = f"; last probe: {status.probe_message}" if status.probe_message else ""
        self.record(f"instance/{name}", "ProbeFailed", reason + last, warning=True)

    # -- stopping -----------------------------------------------------------------------------
    def terminating(self, name: str, *, at: float) -> None:
        """SIGTERM goes out to the instance now (`at`): Terminating; its grace starts."""
        self.touch(name)
        status = self.status[name]
        assert status.stop_sent_at is None
        status.stop_sent_at = at
        status.phase = Phase.TERMINATING
        self.changed()

    def killing(self, name: str) -> None:
        """SIGKILL goes out to the instance: never again for this attempt."""
        self.touch(name)
        self.status[name].kill_sent = True
        self.changed()

    def skipped(self, name: str, why: str) -> None:
        """The instance cannot run here (`why`): Succeeded without launching, activated so
        that its stage passes and nothing launches it; its Ready condition says why."""
        self.touch(name)
        status = self.status[name]
        assert status.attempt < 0 and status.phase is Phase.PENDING
        status.activated = True
        status.phase = Phase.SUCCEEDED
        self.set_condition(status.conditions, "Ready", False, "Skipped", why)

    # -- adoption -----------------------------------------------------------------------------
    def restored(self, name: str, record: Mapping[str, Any]) -> bool:
        """Adoption: the instance's status from its state.json record. Returns whether its
        process was alive then, so the backend should try to adopt it (`adopted`/`gone`).

        Probe timeouts count from now, the adoption.
        """
        self.touch(name)
        status = self.status[name]
        status.phase = Phase(record.get("phase", "Pending"))
        status.restarts = int(record.get("restarts", 0))
        status.attempt = int(record.get("attempt", -1))
        status.ready_attempt = status.attempt if record.get("ready") else None
        # Not known to run until the backend adopts it (`adopted`), nor to have ended.
        status.exited_attempt = status.attempt
        status.activated = bool(record.get("activated")) or status.attempt >= 0
        status.pid = record.get("pid")
        status.step = record.get("step")
        status.exit_code = record.get("exit_code")
        status.log_offset = int(record.get("log_offset", 0))
        status.history = [cast(ExitRecord, h) for h in record.get("history", [])]
        status.started_at = self.clock.now()
        return status.phase in ALIVE

    def adopted(self, name: str, identity: dict[str, int]) -> bool:
        """The backend took over the restored attempt's process: alive again. One that was
        not ready yet is Starting again; returns whether it is to be probed."""
        self.touch(name)
        status = self.status[name]
        assert status.phase in ALIVE, status.phase
        self.came_alive += 1
        status.exited_attempt = status.attempt - 1  # its process runs: alive
        status.identity = identity
        if self.specs[name].probe is None or status.ready:
            return False
        status.phase = Phase.STARTING
        return True

    def gone(self, name: str) -> None:
        """The restored attempt's process ended while no controller watched: an exit of
        unknown status, for its restart policy to decide."""
        self.touch(name)
        status = self.status[name]
        assert status.phase in ALIVE, status.phase
        status.exit_code = None
        status.exited_attempt = status.attempt
        self.record(
            f"instance/{name}",
            "Exited",
            f"gone from {self.specs[name].node} while no controller watched (exit status unknown)",
            warning=True,
        )

    # -- user actions -------------------------------------------------------------------------
    def request(self, name: str, action: UserAction) -> None:
        """A user asked to restart or stop the instance: kept until its controller acts.

        (A live edit's restart is requested by `apply_edit`, without an event of its own.)
        """
        self.touch(name)
        status = self.status[name]
        status.user_action = action
        reason, message = _REQUESTED[action]
        status.restart_reason = message if action is UserAction.RESTART else None
        self.record(f"instance/{name}", reason, message)


def _how(exit_code: int | None, signal: int | None) -> str:
    """`signal 9`, `code 3` or `unknown status`: how an attempt ended, in its events."""
    if signal:
        return f"signal {signal}"
    return f"code {exit_code}" if exit_code is not None else "unknown status"


def _forget_restarts(status: InstanceStatus, window_start: float) -> None:
    """Drop restart times that left the budget's window (at or before `window_start`)."""
    while status.restart_times and status.restart_times[0] <= window_start:
        status.restart_times.popleft()
