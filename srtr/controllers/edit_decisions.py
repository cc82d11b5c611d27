"""What becomes of a live edit's new instances once they ran: pure, like `decisions`."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from srtr.controllers.decisions import Specs, Statuses, could_not_start
from srtr.store.status import Phase


def failed_alone(specs: Specs, statuses: Statuses, desired: AbstractSet[str]) -> set[str]:
    """Instances a live edit added that ended for good before they were ever up: they fail
    alone, as Kubernetes rolls a bad new Deployment without touching the other pods. Neither
    the stage gate, `critical_failure` nor `unstartable` counts them; the edit is marked
    failed instead, and everything that ran before goes on."""
    found = set()
    for name in desired:
        status = statuses[name]
        if not status.added_by_edit or status.ready_attempt is not None:
            continue
        if status.phase is Phase.FAILED or could_not_start(specs[name], status):
            found.add(name)
    return found
