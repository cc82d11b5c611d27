"""The object store: desired state (with its generation) and the observed status of each object.

The store is the single writer of status. Controllers read it and change it only through its
typed transitions (`launched`, `exited`, `probe_passed`, `begin_teardown`, `apply_edit`, ...),
each of which checks its preconditions, writes the fields, and records its event and
condition (which wakes the "changed" subscribers); the caller enqueues whoever should look
next. Observers (progress printer, state.json writer, the metrics) subscribe to events and to
the "changed" signal. Nothing here touches processes or files: `persist.py` does the writing.

`Store` is put together from `StoreBase` (the data, events, conditions; `store_base.py`) and
the transitions of instances (`transitions.py`), of the job (`job_transitions.py`), of live
edits (`edit_transitions.py`) and of health (`health_transitions.py`: probes after the gate,
liveness, a pool's gang restart). The status types are in `status.py` and re-exported here.
"""

from __future__ import annotations

from srtr.store.edit_transitions import EditTransitions
from srtr.store.fleet_transitions import FleetTransitions
from srtr.store.health_transitions import HealthTransitions
from srtr.store.job_transitions import JobTransitions
from srtr.store.status import (
    ALIVE,
    FINISHED,
    Condition,
    Event,
    EventType,
    GangStatus,
    InstanceStatus,
    JobPhase,
    JobStatus,
    Phase,
    UserAction,
)
from srtr.store.store_base import EventListener
from srtr.store.transitions import InstanceTransitions

__all__ = [
    "ALIVE",
    "FINISHED",
    "Condition",
    "Event",
    "EventListener",
    "EventType",
    "GangStatus",
    "InstanceStatus",
    "JobPhase",
    "JobStatus",
    "Phase",
    "Store",
    "UserAction",
]


class Store(
    InstanceTransitions, JobTransitions, EditTransitions, FleetTransitions, HealthTransitions
):
    """Desired state, status per instance, the job's status, and the event stream."""
