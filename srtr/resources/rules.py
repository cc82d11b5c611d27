"""Whole-recipe validation: rules that relate several fields.

`check(recipe)` returns every problem at once, each with the path it is about. Field-level
rules (ranges, vocabularies) are in `recipe.py` and run earlier, inside pydantic.
"""

from __future__ import annotations

from collections import Counter

from srtr.resources import dependencies, health_rules, pool_refs
from srtr.resources.effective import (
    allocation_size,
    effective_per,
    effective_placement,
    effective_readiness,
    effective_restart,
    effective_services,
    env_key,
    frontend_type,
    kind_of,
    roles,
)
from srtr.resources.errors import Path, Problem
from srtr.resources.keys_rules import check_keys
from srtr.resources.kinds import KINDS, get_kind
from srtr.resources.kinds.base import Requirement
from srtr.resources.placeholder_lint import rendered
from srtr.resources.recipe import Recipe, Service


def check(recipe: Recipe) -> list[Problem]:
    """Every whole-recipe problem, in recipe order."""
    problems: list[Problem] = []
    problems += _check_names(recipe)
    for index, service in enumerate(recipe.services):
        problems += _check_service(recipe, index, service)
    problems += _check_pools(recipe)
    problems += _check_discovery(recipe)
    problems += _check_frontend_and_benchmark(recipe)
    problems += _check_roles(recipe)
    problems += _check_growth(recipe)
    owners = [s.name for s, _ in effective_services(recipe) if s.nodes is not None]
    problems += pool_refs.check(rendered(recipe), owners)
    problems += dependencies.check(recipe)
    problems += _check_nul(recipe)
    return problems


def _check_nul(recipe: Recipe) -> list[Problem]:
    """No NUL byte in any string: an argv or environment cannot carry one (exec refuses it),
    so such an instance could never start, and as a live edit it must be refused here."""
    problems: list[Problem] = []

    def walk(value: object, at: Path) -> None:
        if isinstance(value, str):
            if "\0" in value:
                problems.append(Problem(at, "contains a NUL byte, which no argv or env can hold"))
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and "\0" in key:
                    problems.append(Problem((*at, key), "the name contains a NUL byte"))
                walk(item, (*at, key))
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                walk(item, (*at, index))

    walk(recipe.model_dump(by_alias=True, exclude_defaults=True), ())
    return problems


def _check_growth(recipe: Recipe) -> list[Problem]:
    """`resources.max_nodes` caps the whole run, so it cannot be below what the job starts on."""
    cap = recipe.resources.max_nodes
    if cap is None:
        return []
    need = allocation_size(recipe)
    if cap < need:
        return [
            Problem(
                ("resources", "max_nodes"),
                f"is {cap} but the recipe needs {need} node(s); raise max_nodes or shrink "
                "the pools",
            )
        ]
    problems = []
    for index, service in enumerate(recipe.services):
        scale = service.autoscale
        if scale is None or service.nodes is None:
            continue
        room = cap - (need - service.nodes)  # what the cap leaves this pool
        if scale.max > room:
            problems.append(
                Problem(
                    ("services", index, "nodes", "max"),
                    f"is {scale.max} but resources.max_nodes {cap} leaves room for {room} "
                    "node(s) in this pool; lower max or raise max_nodes",
                )
            )
    return problems


def _check_names(recipe: Recipe) -> list[Problem]:
    counts = Counter(s.name for s in recipe.services)
    problems = []
    keys: dict[str, str] = {}
    for index, service in enumerate(recipe.services):
        key = env_key(service.name)
        other = keys.setdefault(key, service.name)
        if other != service.name:
            problems.append(
                Problem(
                    ("services", index, "name"),
                    f"'{service.name}' and '{other}' both become SRT_SERVICE_{key}_* in the "
                    "benchmark env; rename one of them",
                )
            )
    seen: set[str] = set()
    for index, service in enumerate(recipe.services):
        if counts[service.name] > 1 and service.name in seen:
            problems.append(
                Problem(("services", index, "name"), f"must be unique; duplicate: '{service.name}'")
            )
        seen.add(service.name)
    return problems


def _check_service(recipe: Recipe, index: int, service: Service) -> list[Problem]:
    at: Path = ("services", index)
    kind = get_kind(service.type)
    if kind is None:
        known = ", ".join(sorted(KINDS))
        return [
            Problem((*at, "type"), f"'{service.type}' is not a known service type (known: {known})")
        ]
    problems = []
    if kind.needs_command and service.command is None and service.enabled:
        problems.append(Problem((*at, "command"), f"is required for type '{service.type}'"))
    problems += _check_placement(at, service)
    problems += _check_per_worker(at, service)
    unknown = sorted(set(service.options) - set(kind.option_keys))
    if unknown:
        problems.append(
            Problem(
                (*at, "options"),
                f"has keys type '{service.type}' does not understand: {', '.join(unknown)}",
            )
        )
    if kind.validate is not None and service.enabled and not unknown:
        problems += [
            Problem((*at, *where), message) for where, message in kind.validate(service, recipe)
        ]
    if kind.requires is not None and service.enabled and not unknown:
        problems += _check_requirement(at, service, kind.requires)
    return (
        problems
        + _check_infra_kind(at, service)
        + _check_service_fields(at, service)
        + health_rules.check(at, service)
        + check_keys(at, service)
    )


def _check_requirement(at: Path, service: Service, requires: Requirement) -> list[Problem]:
    """The kind's one placement, against the resolved one (the kind's own default counts)."""
    if requires.part == "per":
        got = effective_per(service)
    else:
        got = effective_placement(service)
    if got == requires.value:
        return []
    message = requires.message.format(name=service.name)
    return [Problem((*at, "placement", requires.part), message)]


def _check_infra_kind(at: Path, service: Service) -> list[Problem]:
    """Placement and `external` rules of infra-class kinds."""
    kind = kind_of(service)
    problems = []
    where = effective_placement(service)
    if kind.placements and where not in kind.placements:
        allowed = ", ".join(kind.placements[:-1]) + f", or {kind.placements[-1]}"
        problems.append(
            Problem(
                (*at, "placement", "node"),
                f"(type {service.type}) must be placed on {allowed}; got '{where}'. "
                "The discovery plane lives on the infra node.",
            )
        )
    if service.external is not None and not kind.supports_external:
        problems.append(
            Problem(
                (*at, "external"),
                f"is only valid for discovery-plane kinds, not '{service.type}'",
            )
        )
    if service.external is not None and service.terminal:
        problems.append(
            Problem(
                (*at, "terminal"),
                "needs a process to wait for; an external service launches nothing",
            )
        )
    return problems


def _check_discovery(recipe: Recipe) -> list[Problem]:
    """One etcd and one nats at most, and they agree on a dedicated node."""
    problems = []
    first: dict[str, int] = {}
    for index, service in enumerate(recipe.services):
        kind = get_kind(service.type)
        if kind is None or kind.discovery is None or not service.enabled:
            continue
        other = first.setdefault(service.type, index)
        if other != index:
            problems.append(
                Problem(
                    ("services", index, "type"),
                    f"only one {service.type} service is supported "
                    f"(services[{recipe.services[other].name}] is one)",
                )
            )
    if "etcd" in first and "nats" in first:
        etcd, nats = recipe.services[first["etcd"]], recipe.services[first["nats"]]
        if (effective_placement(etcd) == "dedicated") != (effective_placement(nats) == "dedicated"):
            problems.append(
                Problem(
                    ("services", max(first["etcd"], first["nats"]), "placement", "node"),
                    "services etcd and nats must agree on placement.node: dedicated "
                    "(they share the infra node)",
                )
            )
    return problems


WORKER_PLACEMENTS = ("prefill", "decode", "agg", "workers")


def _check_per_worker(at: Path, service: Service) -> list[Problem]:
    """`placement.per: worker` rules."""
    if effective_per(service) != "worker":
        return []
    per: Path = (*at, "placement", "per")
    if service.nodes is not None:
        return [Problem(per, "worker attaches to engine workers; it cannot own a pool")]
    if service.placement is not None and service.placement.pool:
        return [Problem(per, "worker attaches to engine workers, not to a pool")]
    problems = []
    where = effective_placement(service)
    if where not in WORKER_PLACEMENTS:
        problems.append(
            Problem(
                per,
                f"worker needs placement.node in {', '.join(WORKER_PLACEMENTS)}; got '{where}'",
            )
        )
    readiness = effective_readiness(service)
    if readiness is not None and readiness.log is None:
        problems.append(
            Problem(
                (*at, "readiness"),
                "placement.per: worker instances share their node's ports, so readiness must "
                "be a log probe",
            )
        )
    return problems


def _check_placement(at: Path, service: Service) -> list[Problem]:
    problems = []
    placement = service.placement
    if placement is not None and placement.pool and placement.node:
        problems.append(Problem((*at, "placement"), "give either node or pool, not both"))
    if service.nodes is not None:
        if placement is not None and placement.pool:
            problems.append(
                Problem((*at, "nodes"), "makes the service its own pool; drop placement.pool")
            )
        elif effective_placement(service) != "workers":
            problems.append(
                Problem(
                    (*at, "placement", "node"),
                    "nodes owns a pool, so placement.node must be workers, meaning that pool "
                    f"(got '{effective_placement(service)}')",
                )
            )
    if effective_placement(service) == "dedicated" and not kind_of(service).supports_dedicated:
        infra = ", ".join(sorted(k.name for k in KINDS.values() if k.supports_dedicated))
        problems.append(
            Problem(
                (*at, "placement", "node"),
                f"dedicated is only supported for infra-class kinds ({infra}); "
                f"use head, infra, or workers for type '{service.type}'",
            )
        )
    return problems


def _check_service_fields(at: Path, service: Service) -> list[Problem]:
    problems = []
    if len(service.metrics) > 1:
        names = [m.name for m in service.metrics]
        if None in names or len(set(names)) != len(names):
            problems.append(
                Problem(
                    (*at, "metrics"),
                    f"declares {len(names)} endpoints; give each a distinct name "
                    "(it becomes the endpoint's name in the targets file)",
                )
            )
    if service.terminal and effective_restart(service).policy == "always":
        problems.append(
            Problem(
                (*at, "restart"),
                "terminal services end the job when they exit, so restart: always would never "
                "let the job end; use on-failure or never",
            )
        )
    if service.replace_lost and service.nodes is None:
        problems.append(
            Problem((*at, "replace_lost"), "applies to pool owners (services with nodes) only")
        )
    if service.leader is not None and service.nodes is None:
        problems.append(
            Problem(
                (*at, "leader"),
                "applies to pool owners (services with nodes) only: it is what the pool's "
                "instance 0 runs",
            )
        )
    if service.container is not None and not service.container.strip():
        problems.append(Problem((*at, "container"), "must not be empty"))
    return problems


def _check_pools(recipe: Recipe) -> list[Problem]:
    problems = []
    effective = [s for s, _ in effective_services(recipe)]
    owners = sorted(s.name for s in effective if s.nodes is not None and get_kind(s.type))
    for index, service in enumerate(recipe.services):
        pool = service.placement.pool if service.placement else None
        if pool and service.nodes is None and service.enabled and pool not in owners:
            listed = ", ".join(owners) if owners else "none"
            problems.append(
                Problem(
                    ("services", index, "placement", "pool"),
                    f"'{pool}' names no service that declares nodes (pools: {listed})",
                )
            )
    if owners and recipe.resources.het_jobs:
        problems.append(
            Problem(
                ("resources", "het_jobs"),
                "services[].nodes (pools) are not supported together with resources.het_jobs: "
                f"true; owners: {', '.join(owners)}",
            )
        )
    return problems


def _check_frontend_and_benchmark(recipe: Recipe) -> list[Problem]:
    problems = []
    if frontend_type(recipe) == "none":
        if roles(recipe):
            problems.append(
                Problem(
                    ("frontend", "type"),
                    "none is only supported without engine roles (no prefill/decode/agg workers); "
                    "pick a frontend for the workers or drop them",
                )
            )
        if recipe.frontend.dedicated_node:
            problems.append(
                Problem(
                    ("frontend", "dedicated_node"),
                    "frontend.type: none has no frontend process; "
                    "frontend.dedicated_node is invalid",
                )
            )
        if recipe.frontend.command is not None:
            problems.append(
                Problem(("frontend", "command"), "frontend.type: none runs no frontend command")
            )
    terminal = [s.name for s in recipe.services if s.terminal and s.enabled]
    if terminal and recipe.benchmark.type != "manual":
        problems.append(
            Problem(
                ("benchmark", "type"),
                f"services[{', '.join(terminal)}].terminal ends the job when the service exits, so "
                f"the job cannot also run benchmark.type: {recipe.benchmark.type}; drop the "
                "benchmark block (manual) or the terminal flag",
            )
        )
    if recipe.benchmark.type == "manual" and recipe.benchmark.command is not None:
        problems.append(
            Problem(("benchmark", "command"), "is only run with benchmark.type: custom")
        )
    return problems


def _check_roles(recipe: Recipe) -> list[Problem]:
    problems = []
    gpus_per_node = recipe.resources.gpus_per_node
    for name, role in roles(recipe):
        workers = role.workers or role.nodes
        per_node = -(-workers // role.nodes)
        if role.gpus and per_node * role.gpus > gpus_per_node:
            problems.append(
                Problem(
                    ("roles", name, "gpus"),
                    f"{per_node} worker(s) per node × {role.gpus} GPUs exceeds "
                    f"resources.gpus_per_node ({gpus_per_node})",
                )
            )
        if role.command is None and (role.readiness or role.env):
            problems.append(
                Problem(
                    ("roles", name, "command"),
                    "is needed for readiness/env: a role without command only holds its nodes",
                )
            )
    return problems
