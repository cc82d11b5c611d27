"""Effective values of a recipe: the defaults a user did not write, applied.

The defaults are srtctl's (docs/design/srtctl-parity.md, "Defaults a service gets").

Pure helpers shared by `rules.py` (validation), `expand.py` (objects) and `render.py` (plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from srtr.resources.kinds import Kind, get_kind
from srtr.resources.recipe import (
    Metrics,
    Placement,
    Readiness,
    Recipe,
    RestartPolicy,
    Role,
    Service,
)

ROLE_NAMES = ("prefill", "decode", "agg")
IMPLIED_REASON = "observability.exporters"
# In srtctl's order: dcgm, node, then process exporter. dcgm and node
# watch the compute nodes; the process exporter keeps its kind's default (`all`).
IMPLIED_EXPORTERS = ("dcgm-exporter", "node-exporter", "process-exporter")
_IMPLIED_PLACEMENT = {"dcgm-exporter": "compute", "node-exporter": "compute"}


def kind_of(service: Service) -> Kind:
    kind = get_kind(service.type)
    if kind is None:  # rules.py refuses unknown types before anything asks
        raise KeyError(service.type)
    return kind


def roles(recipe: Recipe) -> list[tuple[str, Role]]:
    """Declared engine roles in carving order."""
    return [(n, r) for n in ROLE_NAMES if (r := getattr(recipe.roles, n)) is not None]


def engine_node_count(recipe: Recipe) -> int:
    return sum(role.nodes for _, role in roles(recipe))


def frontend_type(recipe: Recipe) -> str:
    if recipe.frontend.type is not None:
        return recipe.frontend.type
    return "generic" if roles(recipe) else "none"


def effective_services(recipe: Recipe) -> list[tuple[Service, str | None]]:
    """Enabled services with the reason each implied one exists (None when declared).

    Implied exporters come first; a declared service with the same name replaces the implied
    one in its slot, and `enabled: false` drops it.
    """
    declared = {s.name: s for s in recipe.services}
    out: list[tuple[Service, str | None]] = []
    if recipe.observability.exporters:
        for name in IMPLIED_EXPORTERS:
            if name in declared:
                out.append((declared[name], None))
            else:
                where = _IMPLIED_PLACEMENT.get(name)
                placement = Placement(node=where) if where else None
                implied = Service(name=name, type=name, placement=placement)
                out.append((implied, IMPLIED_REASON))
    taken = {s.name for s, _ in out}
    out.extend((s, None) for s in recipe.services if s.name not in taken)
    return [(s, why) for s, why in out if s.enabled]


def pool_services(recipe: Recipe) -> list[Service]:
    return [s for s, _ in effective_services(recipe) if s.nodes is not None]


def services_node_count(recipe: Recipe) -> int:
    return sum(s.nodes or 0 for s in pool_services(recipe))


def total_nodes(recipe: Recipe) -> int:
    """Nodes the recipe's work needs, dedicated nodes excluded."""
    return max(1, engine_node_count(recipe) + services_node_count(recipe))


def is_external(service: Service) -> bool:
    """An `external:` service launches nothing: its address is injected instead."""
    return service.external is not None


def dedicated_infra(recipe: Recipe) -> bool:
    """A launched infra-class service (etcd, nats) asks for its own node."""
    return any(
        kind_of(s).supports_dedicated
        and not is_external(s)
        and effective_placement(s) == "dedicated"
        for s, _ in effective_services(recipe)
        if get_kind(s.type) is not None
    )


def dedicated_roles(recipe: Recipe) -> list[str]:
    """The roles that share the one reserved node, in srtctl's order."""
    out = ["infra"] if dedicated_infra(recipe) else []
    if recipe.frontend.dedicated_node:
        out.append("frontend")
    if recipe.benchmark.client_dedicated_node:
        out.append("client")
    return out


def allocation_size(recipe: Recipe) -> int:
    """The smallest allocation that fits: work nodes plus one shared dedicated node."""
    return total_nodes(recipe) + (1 if dedicated_roles(recipe) else 0)


def effective_start(service: Service) -> str:
    return service.start or kind_of(service).default_start


def effective_pool(service: Service) -> str | None:
    if service.nodes is not None:
        return service.name
    return service.placement.pool if service.placement else None


def effective_placement(service: Service) -> str:
    if service.placement is not None:
        if service.placement.pool:
            return "workers"
        if service.placement.node:
            return service.placement.node
        return "workers" if service.nodes is not None else "head"
    if service.nodes is not None:
        return "workers"
    return kind_of(service).default_placement


def effective_per(service: Service) -> str:
    """`node` or `worker`: a written placement block says it (default node), else the kind."""
    if service.placement is not None:
        return service.placement.per or "node"
    return kind_of(service).default_per


def effective_readiness(service: Service) -> Readiness | None:
    """The recipe's probe, else the kind's."""
    if service.readiness is not None:
        return service.readiness
    make = kind_of(service).default_readiness
    return make(service.options) if make is not None else None


def effective_container(service: Service, recipe: Recipe) -> str | None:
    """The recipe's container, else the kind's fallback: the container of the service it needs."""
    if service.container is not None:
        return service.container
    source = kind_of(service).container_from
    if source is None:
        return None
    for other in recipe.services:
        if other.type == source and other.enabled and other is not service:
            return other.container
    return None


def effective_critical(service: Service) -> bool:
    return service.critical if service.critical is not None else kind_of(service).default_critical


def _command(service: Service, kind: Kind, index: int) -> list[str]:
    """The argv of instance `index`: the recipe's command, else the kind's, plus `args`; a
    pool's leader (instance 0) replaces whichever of the two it gives."""
    leader = service.leader if index == 0 else None
    base = leader.command if leader is not None and leader.command is not None else None
    base = base if base is not None else service.command
    if base is None and kind.instance_command is not None:
        base = kind.instance_command(service.options, index)
    elif base is None and kind.default_command is not None:
        base = kind.default_command(service.options)
    args = leader.args if leader is not None and leader.args is not None else service.args
    return [*(base or []), *args]


def per_instance_shape(service: Service) -> bool:
    """Whether instance 0 differs from the others (a cluster kind's head, a pool's leader)."""
    kind = kind_of(service)
    return (
        kind.instance_command is not None
        or kind.instance_probe is not None
        or service.leader is not None
    )


def is_rider(service: Service) -> bool:
    return service.nodes is None and bool(service.placement and service.placement.pool)


def effective_restart(service: Service) -> RestartPolicy:
    """Riders default to on-failure (a sidecar that died is worth another try), everything
    else to never."""
    if service.restart is not None:
        return service.restart
    return RestartPolicy(policy="on-failure" if is_rider(service) else "never")


def effective_metrics(service: Service) -> list[Metrics]:
    if service.metrics:
        return list(service.metrics)
    port = kind_of(service).default_metrics_port
    return [Metrics(port=port(service.options))] if port else []


START_TIERS = {"after_frontend": 0, "with_workers": 1, "before_workers": 1, "infra": 2}


def effective_tier(service: Service, by_name: dict[str, Service]) -> int:
    """Explicit tier, else the owner's tier for riders, else the start phase's."""
    if service.shutdown_tier is not None:
        return service.shutdown_tier
    if is_rider(service) and service.placement and service.placement.pool in by_name:
        owner = by_name[service.placement.pool]
        if owner is not service:
            return effective_tier(owner, by_name)
    return START_TIERS[effective_start(service)]


def env_key(name: str) -> str:
    """`dcgm-exporter` → `DCGM_EXPORTER`."""
    return "".join(c if c.isalnum() and c.isascii() else "_" for c in name).upper()


@dataclass(frozen=True)
class Resolved:
    """An enabled service with every default applied, worked out once per planning.

    Planning (expand, instances, discovery, render) reads these fields instead of asking the
    kind again at each use, so a kind is only ever read here.
    """

    service: Service
    kind: Kind
    reason: str | None  # why an implied service exists; None when the recipe declares it
    start: str
    placement: str
    per: str
    pool: str | None
    rider: bool
    external: bool
    critical: bool
    restart: RestartPolicy
    readiness: Readiness | None
    metrics: tuple[Metrics, ...]
    container: str | None
    tier: int
    per_instance_shape: bool  # instance 0 differs from the others (a head, a leader)

    @property
    def name(self) -> str:
        return self.service.name

    def command(self, index: int = 0) -> list[str]:
        return _command(self.service, self.kind, index)


def resolve(recipe: Recipe) -> list[Resolved]:
    """The enabled services of a validated recipe, resolved, in `effective_services` order."""
    effective = effective_services(recipe)
    by_name = {s.name: s for s, _ in effective}
    return [
        Resolved(
            service=s,
            kind=kind_of(s),
            reason=why,
            start=effective_start(s),
            placement=effective_placement(s),
            per=effective_per(s),
            pool=effective_pool(s),
            rider=is_rider(s),
            external=is_external(s),
            critical=effective_critical(s),
            restart=effective_restart(s),
            readiness=effective_readiness(s),
            metrics=tuple(effective_metrics(s)),
            container=effective_container(s, recipe),
            tier=effective_tier(s, by_name),
            per_instance_shape=per_instance_shape(s),
        )
        for s, why in effective
    ]
