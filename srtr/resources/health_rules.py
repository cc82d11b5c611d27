"""Rules and warnings about a service's health: `liveness`, `restart.scope`, hanging pools.

`check(at, service)` gives the problems of one service (called by `rules.py`); `warnings`
the plan-time warnings of the whole recipe (called by `planning.py`). Pure.
"""

from __future__ import annotations

from srtr.resources.effective import effective_critical, effective_per, effective_restart
from srtr.resources.errors import Path, Problem
from srtr.resources.liveness import Liveness
from srtr.resources.recipe import Recipe, Service

HANGS = (
    "is a terminal pool of {n} nodes with neither critical: true nor restart.scope: pool; "
    "one failed member leaves the others waiting forever"
)


def check(at: Path, service: Service) -> list[Problem]:
    return _check_scope(at, service) + _check_liveness(at, service)


def _check_scope(at: Path, service: Service) -> list[Problem]:
    restart = service.restart
    if restart is None or restart.scope != "pool":
        return []
    where: Path = (*at, "restart", "scope")
    if service.nodes is None:
        return [
            Problem(
                where,
                "pool applies to pool owners (services with nodes) only; a rider or a "
                "service outside a pool restarts on its own",
            )
        ]
    if restart.policy == "never":
        return [Problem(where, "pool needs policy on-failure or always (never restarts nothing)")]
    return []


def _check_liveness(at: Path, service: Service) -> list[Problem]:
    out = _check_probe((*at, "liveness"), service, service.liveness)
    if service.leader is not None:
        out += _check_probe((*at, "leader", "liveness"), service, service.leader.liveness)
    return out


def _check_probe(where: Path, service: Service, liveness: Liveness | None) -> list[Problem]:
    if liveness is None:
        return []
    if service.external is not None:
        return [Problem(where, "needs a process to watch; an external service launches nothing")]
    ports = liveness.port is not None or liveness.tcp is not None or liveness.http is not None
    if ports and effective_per(service) == "worker":
        return [
            Problem(
                where,
                "placement.per: worker instances share their node's ports, so liveness must "
                "be an exec, file or log probe",
            )
        ]
    return []


def warnings(recipe: Recipe) -> list[Problem]:
    """A terminal pool of two or more nodes that nothing restarts or fails as a whole: a
    static rendezvous (torchrun, JAX) whose one failed rank leaves the others hanging."""
    out = []
    for index, service in enumerate(recipe.services):
        nodes = service.nodes or 0
        if not service.enabled or not service.terminal or nodes < 2:
            continue
        if effective_critical(service) or effective_restart(service).scope == "pool":
            continue
        out.append(Problem(("services", index), HANGS.format(n=nodes), warning=True))
    return out
