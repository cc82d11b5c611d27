"""Typed transitions of the job's status, its stages and its pools.

The job goes Pending → Launching (`job_launching`) → Running (`job_running`, every stage up)
→ TearingDown (`begin_teardown`) → Succeeded/Failed (`job_finished`). Stages pass one by one
(`launch_stage`, `stage_passed`); `converged` marks a live edit as rolled out. As in
`transitions.py`, nothing here enqueues: the calling controller does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from srtr.resources.objects import Stage
from srtr.store import causes
from srtr.store.status import JobPhase, Phase
from srtr.store.store_base import StoreBase


class JobTransitions(StoreBase):
    """Transitions of `JobStatus`, stage activation and pool readiness, mixed into `Store`."""

    def job_launching(self) -> None:
        """The job controller's first visit: Launching, with the job's size as an event."""
        job = self.job
        assert job.phase is JobPhase.PENDING, job.phase
        job.phase = JobPhase.LAUNCHING
        job.started_at = self.clock.now()
        self.record(
            "job",
            "PhaseStarted",
            f"launching {len(self.specs)} instance(s) in {len(self.desired.stages)} "
            f"stage(s) on {len(self.desired.nodes.allocation)} node(s)",
        )

    def activate(self, name: str) -> None:
        """The instance's stage has begun: its controller may launch it."""
        self.touch(name)
        self.status[name].activated = True
        self.changed()

    def activate_late(self, name: str) -> None:
        """A live edit added the instance to a stage that had passed: activate it, and hold
        later stages' new members until it is up (`settled`)."""
        self.touch(name)
        self.status[name].late = True
        self.activate(name)

    def settled(self, name: str) -> None:
        """A late instance is up (ready, or done): it no longer holds later stages."""
        self.touch(name)
        self.status[name].late = False
        self.changed()

    def launch_stage(self, number: int, stage: Stage, names: tuple[str, ...]) -> None:
        """Stage `number` begins now: activate `names` (its members not yet activated); its
        gate's readiness deadlines count from now."""
        self.job.stage_started_at[stage.name] = self.clock.now()
        self._touch_stage(stage.name)  # its members' probe deadlines count from now
        for name in names:
            self.activate(name)
        self.record(
            "job",
            "PhaseStarted",
            f"stage {number}/{len(self.desired.stages)} {stage.name}: launching "
            f"{len(stage.instances)} instance(s)",
        )

    def gate_opened_at(self, stage: str) -> float | None:
        """When `stage` began, while its gate is open (begun, not passed); else None."""
        if stage in self.job.passed_stages:
            return None
        return self.job.stage_started_at.get(stage)

    def dependents_waiting(self, waiting: dict[str, str]) -> None:
        """The services with depends_on that wait for their conditions, and for what."""
        if waiting != self.job.waiting:
            self.job.waiting = dict(waiting)
            self.changed()

    def stage_passed(self, number: int, name: str) -> None:
        """Every member of stage `number` is up: the next stage may begin."""
        self.job.passed_stages.add(name)
        self.job.stage = number
        self._touch_stage(name)  # its gate is closed: no member's deadline is the gate's

    def _touch_stage(self, stage: str) -> None:
        for spec in self.specs.values():
            if spec.stage == stage:
                self.touch(spec.name)

    def job_running(self, ending: str) -> None:
        """Every stage is up: Running, Ready condition True; `ending` says what ends the job."""
        job = self.job
        assert job.phase is JobPhase.LAUNCHING, job.phase
        job.phase = JobPhase.RUNNING
        self.set_condition(job.conditions, "Ready", True, "AllStagesUp", ending)
        self.record("job", "PhaseStarted", "every stage is up; " + ending)

    def converged(self) -> None:
        """The last applied generation is rolled out: observed_generation catches up."""
        job = self.job
        job.observed_generation = job.generation
        self.record("job", "Converged", f"generation {job.generation} is rolled out")

    def begin_teardown(self, *, exit_code: int, reason: str) -> bool:
        """End the job: remember why and with which code; TearingDown.

        The first reason wins: returns False, changing nothing, when a teardown has begun.
        """
        job = self.job
        if job.teardown_requested:
            return False
        job.teardown_requested = True
        job.exit_code = exit_code
        job.reason = reason
        job.phase = JobPhase.TEARING_DOWN
        self.set_condition(job.conditions, "Ready", False, "TearingDown", reason)
        self.record(
            "job",
            "TearingDown",
            f"{reason}; tearing down (exit code {exit_code})",
            warning=exit_code != 0,
        )
        return True

    def request_kill(self) -> None:
        """Kill now (a second Ctrl+C, `srtr down --kill`): SIGKILL to whatever still runs."""
        assert self.job.teardown_requested
        self.job.kill_now = True

    def job_finished(self) -> int:
        """Nothing runs any more: the job Succeeded or Failed; returns its exit code.

        Activated instances waiting to (re)start are Stopped: they never will.
        """
        job = self.job
        for name, status in self.status.items():
            if status.phase in (Phase.PENDING, Phase.BACKOFF) and status.activated:
                status.phase = Phase.STOPPED
                self.touch(name)
        code = job.exit_code or 0
        job.phase = JobPhase.SUCCEEDED if code == 0 else JobPhase.FAILED
        job.ended_at = self.clock.now()
        self.record(
            "job",
            "JobSucceeded" if code == 0 else "JobFailed",
            f"exit code {code}: {job.reason}",
            warning=code != 0,
        )
        return code

    def pool_readiness(self, name: str, *, ready: int, total: int, done: int = 0) -> None:
        """`ready` of the pool's `total` owner instances are ready; ready when all of them are.
        `done` of the others finished their work (terminal, exit 0).

        A flip is a PoolReady/PoolNotReady event, except during a teardown, where losing
        readiness is the point, not news, and when only finished members make the pool not
        ready (a terminal pool whose rank 0 is done).
        """
        is_ready = total > 0 and ready == total
        if is_ready == self.pool(name).ready:
            return
        self.pool(name).ready = is_ready
        if self.job.teardown_requested or (not is_ready and done and ready + done == total):
            self.changed()
            return
        self.record(
            f"pool/{name}",
            "PoolReady" if is_ready else "PoolNotReady",
            f"{name} {ready}/{total} ready",
            warning=not is_ready,
        )

    def restore_job(self, job: Mapping[str, Any]) -> None:
        """Adoption: the job's status from state.json's `job` section (generation, stages,
        phase, the first failure, and the teardown's code and reason if one had begun)."""
        status = self.job
        status.cause = causes.restored_cause(job.get("cause"))
        status.generation = int(job.get("generation", 1))
        status.observed_generation = int(job.get("observed_generation", 0))
        status.passed_stages = set(job.get("passed_stages", []))
        status.stage = int(job.get("stage", 0))
        # Readiness deadlines of a stage still open count from now, the adoption, as probe
        # timeouts do (`restored`); a stage that begins later sets its own start.
        now = self.clock.now()
        for stage in self.desired.stages:
            if stage.name not in status.passed_stages:
                status.stage_started_at[stage.name] = now
        phase = JobPhase(job.get("phase", "Pending"))
        status.phase = JobPhase.LAUNCHING if phase is JobPhase.PENDING else phase
        if phase is JobPhase.TEARING_DOWN:
            status.teardown_requested = True
            status.exit_code = job.get("exit_code")
            status.reason = str(job.get("reason", "teardown"))
