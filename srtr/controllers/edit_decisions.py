"""What becomes of a live edit's new instances once they ran: pure, like `decisions`."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from srtr.controllers.decisions import Gate, Specs, Statuses, could_not_start, setup_gate
from srtr.resources.node_setup import per_node
from srtr.resources.objects import Stage
from srtr.store.status import Phase


def failed_alone(specs: Specs, statuses: Statuses, desired: AbstractSet[str]) -> set[str]:
    """Instances a live edit added that ended for good before they were ever up: they fail
    alone, as Kubernetes rolls a bad new Deployment without touching the other pods. Neither
    the stage gate, `critical_failure` nor `unstartable` counts them; the edit is marked
    failed instead, and everything that ran before goes on. A per-node setup is not one of
    them: its node's instances cannot run without it, so it fails the job
    (`late_setup_gate`)."""
    found = set()
    for name in desired:
        status = statuses[name]
        if not status.added_by_edit or status.ready_attempt is not None:
            continue
        if per_node(specs[name]):
            continue
        if status.phase is Phase.FAILED or could_not_start(specs[name], status):
            found.add(name)
    return found


def late_setup_gate(
    stages: Sequence[Stage], specs: Specs, statuses: Statuses, *, now: float
) -> Gate:
    """The gate of per-node setups added to a stage that passed: a node the service gained
    (a grow, a replacement, a bigger pool). Its instances there wait for it
    (`decisions.next_stage` holds a late member until the earlier stages' late members are
    up); one that exits non-zero or outlives its timeout fails the job as at first launch."""
    if not any(status.late for status in statuses.values()):
        return setup_gate([], now=now)  # no edit added members: no lookup per instance
    members = [
        (specs[name], statuses[name])
        for stage in stages
        for name in stage.instances
        if statuses[name].late and per_node(specs[name])
    ]
    return setup_gate(members, now=now)
