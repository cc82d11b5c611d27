"""Typed transitions of fleet gates: a stage that waits for a whole cluster.

A fleet gate opens once every member of its stage is ready (`fleet_opened`); each poll of the
head's member list is recorded (`fleet_polled`), and the gate is passed once the head sees
every member alive. The job controller judges failures (`fleet_decisions.fleet_gate`); as in
`transitions.py`, nothing here enqueues.
"""

from __future__ import annotations

from srtr.resources.objects import Stage
from srtr.store.status_parts import FleetStatus
from srtr.store.store_base import StoreBase

__all__ = ["FleetStatus", "FleetTransitions"]


class FleetTransitions(StoreBase):
    """Fleet gate status per stage name (`StoreBase.fleets`), mixed into `Store`."""

    def fleet(self, stage: str) -> FleetStatus:
        return self.fleets.setdefault(stage, FleetStatus())

    def fleets_passed(self) -> set[str]:
        return {name for name, status in self.fleets.items() if status.passed}

    def fleet_opened(self, stage: Stage) -> None:
        """Every member of `stage` is ready: its fleet gate's timeout counts from now."""
        assert stage.fleet is not None
        status = self.fleet(stage.name)
        status.opened_at = self.clock.now()
        self.record(
            f"service/{stage.fleet.service}",
            "FleetWaiting",
            f"every instance is ready; waiting for {stage.fleet.count} {stage.fleet.label} "
            f"alive at {stage.fleet.url}",
        )

    def fleet_poll_started(self, stage: str) -> None:
        status = self.fleet(stage)
        status.in_flight = True
        status.polled_at = self.clock.now()

    def fleet_polled(self, stage: Stage, alive: int | None, message: str) -> None:
        """One answer (or none) from the head; passed once `alive` reaches the count."""
        assert stage.fleet is not None
        status = self.fleet(stage.name)
        status.in_flight = False
        status.message = message
        if alive == status.alive or status.passed:
            self.changed()
            return
        status.alive = alive
        fleet = stage.fleet
        if alive is not None and alive >= fleet.count:
            status.passed = True
            self.record(
                f"service/{fleet.service}",
                "FleetReady",
                f"{alive}/{fleet.count} {fleet.label} alive",
            )
            return
        self.record(
            f"service/{fleet.service}",
            "FleetWaiting",
            f"{alive if alive is not None else '?'}/{fleet.count} {fleet.label} alive ({message})",
        )
