"""The store's data and its generic writes: events, conditions, phases.

`StoreBase` holds what the store holds (desired state, every instance's status, the job's
status) and the writes every transition is built from: `record` (an event), `set_condition`
and `set_phase`, and `changed` (wakes subscribers). The typed transitions live in
`transitions.py`, `job_transitions.py` and `edit_transitions.py`; `store.Store` puts them
together. Controllers never call these writes except `record`, for events about what they did
(signals sent, a plan applied) rather than about a change of status.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from srtr.reconciler.clock import Clock
from srtr.resources.objects import DesiredState, InstanceKind, InstanceSpec
from srtr.store.status import (
    ALIVE,
    Condition,
    Event,
    EventType,
    InstanceStatus,
    JobStatus,
    Phase,
)
from srtr.store.status_parts import (
    ExporterStatus,
    FleetStatus,
    GrowStatus,
    PoolStatus,
    RecipeStatus,
    ReplacementFence,
)
from srtr.store.write_faults import WriteFaults

EventListener = Callable[[Event], None]


class StoreBase:
    """Desired state, status per instance, the job's status, and the event stream.

    The data and the generic writes (events, conditions, phase) that every transition uses;
    `Store` adds the typed transitions.
    """

    def __init__(self, desired: DesiredState, clock: Clock) -> None:
        self.clock = clock
        self.desired = desired
        self.specs: dict[str, InstanceSpec] = {s.name: s for s in desired.instances}
        self.status: dict[str, InstanceStatus] = {n: InstanceStatus() for n in self.specs}
        self.job = JobStatus()
        # Per pool: readiness, what it waits for (a grow request), its autoscaling.
        self.pools: dict[str, PoolStatus] = {p.name: PoolStatus() for p in desired.pools}
        # Instances a live edit dropped: still in specs/status until their process is gone.
        self.removing: set[str] = set()
        # Launched attempts whose identity (what adoption and the guard check) is not read yet.
        self.unidentified: set[str] = set()
        # How many times an instance came alive (launched, adopted): while it is unchanged,
        # the alive instances are a subset of those alive before (the teardown's memo).
        self.came_alive = 0
        self.desired_names: set[str] = set(self.specs)
        # Live edits: the applied text, the latest saved text, a plan waiting for the user's
        # yes (confirm mode), the last rejection; persisted under "recipe" in state.json.
        self.recipe = RecipeStatus()
        # Growing past the allocation (state.json's `grow` while `grow.enabled`).
        self.grow = GrowStatus()
        # The exporter controller's targets and scrape health; None until it started.
        self.exporters: ExporterStatus | None = None
        self.fences = ReplacementFence()
        self.fleets: dict[str, FleetStatus] = {}
        # Files of the run dir that cannot be written now (state.json `job.write_faults`).
        self.write_faults = WriteFaults(self)
        self._event_listeners: list[EventListener] = []
        self._change_listeners: list[Callable[[], None]] = []
        self._outbox: deque[Event] = deque()
        self._delivering = False
        # Instances whose persisted record may have changed since the state writer last
        # took them: what makes a big job's state.json delta O(change), not O(job).
        self.touched: set[str] = set()

    # -- reading ------------------------------------------------------------------------
    @property
    def recipe_text(self) -> str:
        """The applied recipe's text."""
        return self.recipe.text

    @recipe_text.setter
    def recipe_text(self, text: str) -> None:
        self.recipe.text = text

    def pool(self, name: str) -> PoolStatus:
        """A pool's status (made on first use: a pool a pending edit adds waits too)."""
        return self.pools.setdefault(name, PoolStatus())

    def spec(self, name: str) -> InstanceSpec:
        return self.specs[name]

    def instances_of_pool(self, pool: str) -> list[str]:
        return [n for n, s in self.specs.items() if s.pool == pool and s.kind is InstanceKind.OWNER]

    def alive(self) -> list[str]:
        return [n for n, st in self.status.items() if st.alive]

    # -- writing ------------------------------------------------------------------------
    def touch(self, name: str) -> None:
        """Instance `name`'s record in state.json changes: the next write carries it."""
        self.touched.add(name)

    def take_touched(self) -> set[str]:
        """The instances touched since the last call (the state writer's)."""
        touched, self.touched = self.touched, set()
        return touched

    def subscribe_events(self, listener: EventListener) -> None:
        self._event_listeners.append(listener)

    def subscribe_changes(self, listener: Callable[[], None]) -> None:
        self._change_listeners.append(listener)

    def changed(self) -> None:
        for listener in self._change_listeners:
            listener()

    def record(self, obj: str, reason: str, message: str, *, warning: bool = False) -> Event:
        if obj.startswith("instance/"):
            self.touched.add(obj[len("instance/") :])
        event = Event(
            ts=round(self.clock.wall(), 3),
            type=EventType.WARNING if warning else EventType.NORMAL,
            reason=reason,
            object=obj,
            message=message,
            generation=self.job.generation,
        )
        self._outbox.append(event)
        self._deliver()
        self.changed()
        return event

    def _deliver(self) -> None:
        """Every listener sees every event, in the order recorded.

        An event recorded by a listener (a writer reporting that it cannot write) waits
        until the current event has reached every listener, instead of overtaking it.
        """
        if self._delivering:
            return
        self._delivering = True
        try:
            while self._outbox:
                event = self._outbox.popleft()
                for listener in self._event_listeners:
                    listener(event)
        finally:
            self._delivering = False

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
        self.touched.add(name)
        if status.phase != phase:
            status.phase = phase
            if phase not in ALIVE or phase is Phase.TERMINATING:
                self.set_condition(status.conditions, "Ready", False, str(phase))
            self.changed()
