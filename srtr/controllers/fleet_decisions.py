"""Pure decisions of the fleet gate: values in, a verdict out.

A stage with a fleet gate (a `ray` service) passes only once every member is ready *and* the
head lists every member alive. While the gate is open, a member that exits fails it at once
(srtctl: "fails fast if a step exits"), and so does `timeout_seconds` without enough live
members: `only <a>/<n> Ray nodes alive after 600s`.
"""

from __future__ import annotations

from srtr.controllers.decisions import Gate, Specs, Statuses, owner_text
from srtr.resources.objects import Stage
from srtr.store.status import FINISHED


def members_ready(stage: Stage, statuses: Statuses) -> bool:
    """Every member of `stage` runs and passed its readiness: the fleet gate may open."""
    return all(statuses[n].alive and statuses[n].ready for n in stage.instances)


def fleet_gate(
    stage: Stage,
    specs: Specs,
    statuses: Statuses,
    *,
    opened_at: float | None,
    alive: int | None,
    now: float,
) -> Gate:
    """The verdict on the open fleet gate of `stage` (opened at `opened_at`, None: not yet;
    `alive`: live members at the last answer, None: no answer yet, as after a dead
    dashboard). `wake_in` is the time left until its timeout."""
    fleet = stage.fleet
    if fleet is None or opened_at is None:
        return Gate()
    seen = alive or 0
    for name in stage.instances:
        spec, status = specs[name], statuses[name]
        if status.attempt >= 0 and (status.phase in FINISHED or status.exited):
            code = "unknown" if status.exit_code is None else status.exit_code
            return Gate(
                failed=name,
                reason=(
                    f"{owner_text(spec)} on {spec.node} exited with code {code} while "
                    f"waiting for {fleet.count} {fleet.label} to be alive ({seen}/{fleet.count} "
                    f"at {fleet.url}); see {spec.log}"
                ),
            )
    left = opened_at + fleet.timeout_seconds - now
    if left <= 0:
        return Gate(
            failed=stage.instances[0],
            reason=(
                f"{owner_text(specs[stage.instances[0]])}: only {seen}/{fleet.count} "
                f"{fleet.label} alive after {fleet.timeout_seconds:g}s ({fleet.url})"
            ),
        )
    return Gate(wake_in=left)
