"""`depends_on`: the rules that relate it to the other services, and the start graph.

A service with `depends_on` leaves the phases' chain: its stages begin as soon as its
dependencies' conditions hold (`controllers/dependency_decisions.py` decides when), so
independent branches start in parallel. Services without it keep the chain's order. The
chain still waits, at each phase, for the dependents of earlier phases, so a dependency may
not be of a later phase than its dependent: that is the one order the phases forbid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from srtr.resources.effective import effective_restart, effective_services, effective_start
from srtr.resources.errors import Path, Problem
from srtr.resources.objects import DependencySpec, InstanceKind, InstanceSpec
from srtr.resources.recipe import Recipe, Service

# The start phases in launch order (expand.PHASE_ORDER's, which imports this module).
PHASE_RANK = {"infra": 0, "before_workers": 1, "with_workers": 2, "after_frontend": 5}


def check(recipe: Recipe) -> list[Problem]:
    """Every problem of the recipe's `depends_on` entries, in recipe order, then cycles."""
    enabled = {s.name: s for s, _ in effective_services(recipe)}
    declared = {s.name for s in recipe.services}
    problems: list[Problem] = []
    for index, service in enumerate(recipe.services):
        if not service.depends_on or service.name not in enabled:
            continue
        at: Path = ("services", index, "depends_on")
        if effective_start(service) == "with_workers":
            problems.append(
                Problem(
                    at,
                    "start: with_workers launches with the engine workers, so nothing can hold "
                    "it back; use start: before_workers or after_frontend with depends_on",
                )
            )
        for name, dependency in service.depends_on.items():
            why = _edge_problem(service, name, dependency.condition, enabled, declared)
            if why:
                problems.append(Problem((*at, name), why))
    return problems + _cycles(recipe, enabled)


def _edge_problem(
    service: Service,
    name: str,
    condition: str,
    enabled: dict[str, Service],
    declared: set[str],
) -> str | None:
    """Why `service` cannot depend on `name` with `condition`, or None."""
    if name == service.name:
        return f"services[{name}] cannot depend on itself"
    if name not in enabled:
        if name in declared:
            return f"services[{name}] is disabled (enabled: false): it never starts"
        known = ", ".join(n for n in enabled if n != service.name) or "none"
        return f"'{name}' is not a service of this recipe (services: {known})"
    other = enabled[name]
    if other.external is not None:
        return f"services[{name}] runs elsewhere (external): srtr starts nothing to wait for"
    phase, theirs = effective_start(service), effective_start(other)
    if PHASE_RANK[theirs] > PHASE_RANK[phase]:
        return (
            f"services[{service.name}] starts in phase {phase}, before services[{name}] "
            f"(start: {theirs}): a dependency cannot start in a later phase; give "
            f"services[{service.name}] start: {theirs} or later"
        )
    if condition == "completed":
        return _never_ends(other, enabled)
    return None


def _never_ends(service: Service, enabled: dict[str, Service]) -> str | None:
    """Why `service` can never complete (every instance exit 0), or None."""
    name = service.name
    if effective_restart(service).policy == "always":
        return f"condition completed can never hold: services[{name}] has restart: always"
    pool = service.placement.pool if service.placement else None
    if service.nodes is None and pool and pool in enabled and not enabled[pool].terminal:
        return (
            f"condition completed can never hold: services[{name}] rides pool {pool}, which "
            "never ends (not terminal)"
        )
    return None


def _cycles(recipe: Recipe, enabled: dict[str, Service]) -> list[Problem]:
    """One problem per cycle, at the depends_on of its first service in recipe order."""
    graph = {
        s.name: [n for n in s.depends_on if n in enabled and n != s.name]
        for s in recipe.services
        if s.name in enabled
    }
    index = {s.name: i for i, s in enumerate(recipe.services)}
    problems: list[Problem] = []
    done: set[str] = set()
    for start in graph:
        cycle = _cycle_from(start, graph, done)
        if cycle is None:
            continue
        first = min(cycle[:-1], key=index.__getitem__)
        problems.append(
            Problem(
                ("services", index[first], "depends_on"),
                "forms a cycle: " + " -> ".join(cycle) + "; none of them could ever start",
            )
        )
        done.update(cycle)
    return problems


def _cycle_from(start: str, graph: dict[str, list[str]], done: set[str]) -> list[str] | None:
    """A cycle reachable from `start` through services not in `done`, as a closed path."""
    path: list[str] = []
    on_path: set[str] = set()
    seen: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in on_path:
            return [*path[path.index(name) :], name]
        if name in seen or name in done:
            return None
        seen.add(name)
        path.append(name)
        on_path.add(name)
        for nxt in graph.get(name, ()):
            found = visit(nxt)
            if found is not None:
                return found
        path.pop()
        on_path.discard(name)
        return None

    return visit(start)


def start_graph(
    recipe: Recipe, instances: Sequence[InstanceSpec]
) -> tuple[list[InstanceSpec], tuple[DependencySpec, ...]]:
    """The dependency edges of a valid recipe on its instances, and the instances with the
    init services' (those depended on with `completed`) marked run-to-completion."""
    services = [service for service, _ in effective_services(recipe)]
    linked = {name for s in services if s.depends_on for name in (s.name, *s.depends_on)}
    members: dict[str, list[str]] = {}
    for spec in instances if linked else ():  # most recipes have no dependencies
        if spec.kind is not InstanceKind.SETUP and spec.service in linked:
            members.setdefault(spec.service, []).append(spec.name)
    edges: list[DependencySpec] = []
    init: set[str] = set()
    for service in services:
        for name, dependency in service.depends_on.items():
            edges.append(
                DependencySpec(
                    service=service.name,
                    on=name,
                    condition=dependency.condition,
                    restart=dependency.restart,
                    instances=tuple(members.get(name, ())),
                    dependents=tuple(members.get(service.name, ())),
                )
            )
            if dependency.condition == "completed":
                init.add(name)
    if init:
        instances = [
            dataclasses.replace(s, run_to_completion=True) if s.service in init else s
            for s in instances
        ]
    return list(instances), tuple(edges)
