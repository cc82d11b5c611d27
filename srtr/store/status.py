"""Status types: what srtr has observed of each instance and of the job, and its events.

Plain data. Only the store (`srtr.store.store` and the transitions it is built from)
writes these; controllers read them and ask the store for transitions. Their JSON form in the
run dir (state.json, events.jsonl) is modelled in `rundir.py` and written by `persist.py`.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict


class Phase(enum.StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    READY = "Ready"
    BACKOFF = "BackOff"
    TERMINATING = "Terminating"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"
    LOST = "Lost"


ALIVE = frozenset({Phase.STARTING, Phase.RUNNING, Phase.READY, Phase.TERMINATING})
FINISHED = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED, Phase.LOST})


class UserAction(enum.StrEnum):
    """What a user (or a live edit) asked of one instance; consumed once acted on."""

    RESTART = "restart"
    STOP = "stop"


class JobPhase(enum.StrEnum):
    PENDING = "Pending"
    LAUNCHING = "Launching"
    RUNNING = "Running"
    TEARING_DOWN = "TearingDown"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


# The job's end: nothing of it runs any more, and its exit code is final.
JOB_ENDED = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED})


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass
class Condition:
    """A typed condition, Kubernetes style: `last_transition` moves only when `status` flips."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition: float


class ExitRecord(TypedDict, total=False):
    """One ended attempt of an instance (state.json `instances[].history[]`): how it ended,
    when, and why srtr stopped it (`planned`) or what failure it was (`reason`)."""

    attempt: int
    exit_code: int | None
    signal: int | None
    at: float
    message: str
    planned: str
    reason: str


@dataclass(slots=True)  # 80,000 of them: each job-wide look reads them all
class InstanceStatus:
    """What srtr has observed of one instance. Mutated only through the Store.

    Each launch is a new `attempt`. Whether the instance is `alive` and `ready` is derived,
    not stored: see the properties. An attempt the backend could not start at all ended at
    once with exit code 127 (`launch_error` says why), like a shell's "command not found".
    """

    phase: Phase = Phase.PENDING
    activated: bool = False  # its launch stage has begun
    # Activated by a live edit after its stage had passed (pool growth), and not up yet:
    # later stages' new members wait for it, as they waited for its stage at the first launch.
    late: bool = False
    # Added by a live edit to a running job: until it is first up, its failure fails it
    # alone, not the job (`controllers.edit_decisions.failed_alone`).
    added_by_edit: bool = False
    attempt: int = -1
    exited_attempt: int = -1  # the last attempt whose end was observed
    ready_attempt: int | None = None  # the last attempt that passed readiness
    launch_error: str | None = None  # why the current attempt could not be launched
    restarts: int = 0
    pid: int | None = None
    step: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    started_at: float | None = None
    ready_at: float | None = None
    exited_at: float | None = None
    next_start_at: float | None = None
    backoff_index: int = 0
    restart_times: deque[float] = field(default_factory=deque)
    stop_sent_at: float | None = None
    kill_sent: bool = False
    probe_message: str = ""
    probe_in_flight: bool = False
    next_probe_at: float | None = None
    identity: dict[str, int] | None = None  # pid + start time: what adoption checks
    user_action: UserAction | None = None  # set by `Store.request`
    # Why a planned restart was asked (a user, a rollout): set with user_action RESTART,
    # carried by `planned` into the next launch. A planned restart is no crash: it touches
    # neither `restarts` nor the restart budget (`restart_times`).
    restart_reason: str | None = None
    planned: str | None = None
    log_offset: int = 0  # where this attempt's output starts in the log (for log probes)
    history: list[ExitRecord] = field(default_factory=list)
    conditions: dict[str, Condition] = field(default_factory=dict)
    # Readiness after the gate: failed attempts in a row, and whether they made it NotReady.
    readiness_failures: int = 0
    not_ready: bool = False
    # Liveness of this attempt: failed attempts in a row and the last one's message, the
    # next attempt's time, one in flight, and whether it failed (so srtr stops it, and its
    # exit is a failure with the reason LivenessFailed, not a stop).
    liveness_failures: int = 0
    liveness_message: str = ""
    liveness_in_flight: bool = False
    next_liveness_at: float | None = None
    liveness_failed: bool = False
    # Its pool's gang restart holds it: stopped (or ended), waiting for the whole pool's
    # relaunch. `gang_restart`: its next launch is that relaunch (counted, not budgeted).
    gang_held: bool = False
    gang_restart: bool = False
    # Its node's agent runs these probes and reports their transitions (`Prober.watch`).
    readiness_on_node: bool = False
    liveness_on_node: bool = False

    @property
    def alive(self) -> bool:
        """The current attempt's process runs: it was launched (Starting, Running, Ready) or
        is being stopped (Terminating), and its end has not been observed."""
        return self.phase in ALIVE and self.exited_attempt != self.attempt

    @property
    def exited(self) -> bool:
        """The current attempt ended (or failed to launch) and its phase still says where it
        was: the instance controller has yet to decide what follows."""
        return self.phase in ALIVE and self.exited_attempt == self.attempt

    @property
    def ready(self) -> bool:
        """The current attempt passed readiness: its probe, or launched without one.

        It stays true once the attempt ends, until the next launch (state.json's `ready`
        has always meant this); whether it is ready now is `alive and ready`, or the Ready
        condition.
        """
        return (
            self.ready_attempt is not None
            and self.ready_attempt == self.attempt
            and not self.not_ready
        )

    @property
    def passed_readiness(self) -> bool:
        """The current attempt passed its readiness gate (NotReady since, or not)."""
        return self.ready_attempt is not None and self.ready_attempt == self.attempt


@dataclass(frozen=True)
class Cause:
    """The job's first failure: the first exit (or lost node, or failed launch) that srtr
    did not cause itself, whatever came after it. `reason` classifies it (`causes.py`:
    OOMKilled, LivenessFailed, NodeLost, LaunchFailed, Error); `at` is wall seconds;
    `log_offset` is where that attempt's output starts in `log` (relative to the run dir)."""

    instance: str
    node: str
    attempt: int
    at: float
    reason: str
    exit_code: int | None
    signal: int | None
    message: str
    log: str
    log_offset: int


@dataclass
class GangStatus:
    """A pool whose owner restarts as a whole (`restart.scope: pool`).

    `restart_times` are the pool restarts within the budget's window; `stopping`: its
    members are being stopped for one; then `next_start_at` is the relaunch's time.
    `failed`: the budget was spent, the pool is Failed (`failed_code`: its first failure's
    exit code)."""

    restarts: int = 0
    restart_times: deque[float] = field(default_factory=deque)
    stopping: bool = False
    next_start_at: float | None = None
    first_failure: str = ""
    failed: bool = False
    failed_code: int = 1


@dataclass
class JobStatus:
    phase: JobPhase = JobPhase.PENDING
    stage: int = 0
    passed_stages: set[str] = field(default_factory=set)
    # When each stage began (monotonic): its gate's readiness deadlines count from there.
    stage_started_at: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    reason: str = ""
    generation: int = 1
    observed_generation: int = 0
    teardown_requested: bool = False
    kill_now: bool = False
    started_at: float | None = None
    ended_at: float | None = None
    # When the allocation's time limit ends (epoch seconds), once the backend said so.
    end_time: float | None = None
    # Seconds before `end_time` that the teardown starts; None: not worked out yet.
    walltime_budget: float | None = None
    conditions: dict[str, Condition] = field(default_factory=dict)
    cause: Cause | None = None  # the first failure (set once, never by a teardown's exits)
    # Services with depends_on not started yet, and what each waits for ("scheduler ready").
    waiting: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    ts: float
    type: EventType
    reason: str
    object: str
    message: str
    generation: int
