"""`depends_on:` of a service, as written: a list of names or a mapping of conditions.

The model only; the rules that relate it to the other services (unknown names, cycles,
conditions that can never hold, phases) and the start graph are `dependencies.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from srtr.resources.spec import Spec

CONDITIONS = ("ready", "started", "completed")


class Dependency(Spec):
    """What a dependent waits for on one service, and whether it follows its restarts.

    `ready`: every instance passed readiness (one without a probe: launched); `started`:
    every instance launched; `completed`: every instance exited 0 (an init service).
    `restart: true`: when the dependency restarts, the dependent is stopped and started
    again once the condition holds again, at no cost to its restart budget.
    """

    condition: Literal["ready", "started", "completed"] = "ready"
    restart: bool = False


def depends_on_form(value: Any) -> Any:
    """The list form (`[scheduler, db]`: condition ready) as the mapping it stands for; a
    mapping's empty value (`scheduler:`) is the default dependency."""
    if isinstance(value, list):
        out: dict[str, Any] = {}
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"depends_on lists service names; got {item!r}")
            if item in out:
                raise ValueError(f"depends_on names '{item}' twice")
            out[item] = {}
        return out
    if isinstance(value, dict):
        return {k: ({} if v is None else v) for k, v in value.items()}
    return value
