"""The object store: desired state (with its generation) and the observed status of each object.

The store is the single writer of status. Controllers read and write it through small
methods; observers (progress printer, state.json writer, later the TUI) subscribe to events
and to a "changed" signal. Nothing here touches processes or files: `persist.py` and
`events.py` do the writing.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from srtr.reconciler.clock import Clock
from srtr.resources.objects import DesiredState, InstanceKind, InstanceSpec


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


class JobPhase(enum.StrEnum):
    PENDING = "Pending"
    LAUNCHING = "Launching"
    RUNNING = "Running"
    TEARING_DOWN = "TearingDown"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


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

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "last_transition": self.last_transition,
        }


@dataclass
class InstanceStatus:
    """What srtr has observed of one instance. Mutated only through the Store."""

    phase: Phase = Phase.PENDING
    activated: bool = False  # its launch stage has begun
    alive: bool = False
    ready: bool = False
    attempt: int = -1
    exited_attempt: int = -1
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
    user_action: str | None = None  # "restart" | "stop", set by an intent
    log_offset: int = 0  # where this attempt's output starts in the log (for log probes)
    history: list[dict[str, Any]] = field(default_factory=list)
    conditions: dict[str, Condition] = field(default_factory=dict)


@dataclass
class JobStatus:
    phase: JobPhase = JobPhase.PENDING
    stage: int = 0
    passed_stages: set[str] = field(default_factory=set)
    exit_code: int | None = None
    reason: str = ""
    generation: int = 1
    observed_generation: int = 0
    teardown_requested: bool = False
    kill_now: bool = False
    started_at: float | None = None
    ended_at: float | None = None
    conditions: dict[str, Condition] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    ts: float
    type: EventType
    reason: str
    object: str
    message: str
    generation: int

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "type": str(self.type),
            "reason": self.reason,
            "object": self.object,
            "message": self.message,
            "generation": self.generation,
        }


EventListener = Callable[[Event], None]


class Store:
    """Desired state, status per instance, the job's status, and the event stream."""

    def __init__(self, desired: DesiredState, clock: Clock) -> None:
        self.clock = clock
        self.desired = desired
        self.specs: dict[str, InstanceSpec] = {s.name: s for s in desired.instances}
        self.status: dict[str, InstanceStatus] = {n: InstanceStatus() for n in self.specs}
        self.job = JobStatus()
        self.pool_ready: dict[str, bool] = {p.name: False for p in desired.pools}
        # Instances a live edit dropped: still in specs/status until their process is gone.
        self.removing: set[str] = set()
        self.desired_names: set[str] = set(self.specs)
        # Live edits: the text of the applied recipe, a plan waiting for the user's yes
        # (confirm mode), and the last rejection; persisted under "recipe" in state.json.
        self.recipe_text: str = ""
        self.pending: tuple[DesiredState, Any, str] | None = None
        self.recipe_view: dict[str, Any] = {}
        # Controllers with job-wide state of their own keep it here, by controller name;
        # `status_views` produce extra top-level sections of state.json.
        self.extensions: dict[str, Any] = {}
        self.status_views: dict[str, Callable[[], Any]] = {}
        self._event_listeners: list[EventListener] = []
        self._change_listeners: list[Callable[[], None]] = []

    # -- reading ------------------------------------------------------------------------
    def spec(self, name: str) -> InstanceSpec:
        return self.specs[name]

    def instances_of_pool(self, pool: str) -> list[str]:
        return [n for n, s in self.specs.items() if s.pool == pool and s.kind is InstanceKind.OWNER]

    def alive(self) -> list[str]:
        return [n for n, st in self.status.items() if st.alive]

    # -- writing ------------------------------------------------------------------------
    def subscribe_events(self, listener: EventListener) -> None:
        self._event_listeners.append(listener)

    def subscribe_changes(self, listener: Callable[[], None]) -> None:
        self._change_listeners.append(listener)

    def changed(self) -> None:
        for listener in self._change_listeners:
            listener()

    def record(self, obj: str, reason: str, message: str, *, warning: bool = False) -> Event:
        event = Event(
            ts=round(self.clock.wall(), 3),
            type=EventType.WARNING if warning else EventType.NORMAL,
            reason=reason,
            object=obj,
            message=message,
            generation=self.job.generation,
        )
        for listener in self._event_listeners:
            listener(event)
        self.changed()
        return event

    def set_condition(
        self,
        conditions: dict[str, Condition],
        type_: str,
        status: bool | None,
        reason: str,
        message: str = "",
    ) -> None:
        """Record a condition; its transition time moves only when its status flips."""
        text = "Unknown" if status is None else str(status)
        current = conditions.get(type_)
        if current is not None and (current.status, current.reason, current.message) == (
            text,
            reason,
            message,
        ):
            return
        since = (
            current.last_transition
            if current and current.status == text
            else round(self.clock.wall(), 3)
        )
        conditions[type_] = Condition(type_, text, reason, message, since)
        self.changed()

    def set_phase(self, name: str, phase: Phase) -> None:
        status = self.status[name]
        if status.phase != phase:
            status.phase = phase
            if phase not in ALIVE or phase is Phase.TERMINATING:
                self.set_condition(status.conditions, "Ready", False, str(phase))
            self.changed()
