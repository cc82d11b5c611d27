"""expand(recipe, allocation) → DesiredState: every instance, pool, stage and exporter.

Pure: no I/O, no clock. `srtr plan` prints its result and `srtr up` hands it to the
controllers, so the dry run is the real code path.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from srtr.resources import collisions, placeholders, pool_refs
from srtr.resources.carving import CarveError, GrowNeeded, carve
from srtr.resources.dependencies import start_graph
from srtr.resources.discovery import discovery_env, layered, receives_discovery_env
from srtr.resources.effective import (
    Resolved,
    engine_node_count,
    env_key,
    frontend_type,
    resolve,
    roles,
)
from srtr.resources.errors import Path, Problem
from srtr.resources.instances import NEVER
from srtr.resources.instances import probe_spec as _probe
from srtr.resources.instances import restart_spec as _restart
from srtr.resources.instances import service_common as _service_common
from srtr.resources.kinds.cache import MOONCAKE_MASTER_PORT, MOONCAKE_METADATA_PORT
from srtr.resources.node_setup import before_launch
from srtr.resources.objects import (
    DesiredState,
    ExporterSpec,
    FleetSpec,
    InstanceKind,
    InstanceSpec,
    NodeMap,
    PoolSpec,
    ProbeSpec,
    Stage,
)
from srtr.resources.placeholder_lint import rendered
from srtr.resources.recipe import Recipe, Service
from srtr.resources.workers import WORKER_KEYS, WorkerSlot, slots_for, worker_slots

# `with_workers` holds only the setup steps (clone, build) of with_workers services: their
# instances launch in the workers stage itself, right before the workers.
PHASE_ORDER = (
    "infra",
    "before_workers",
    "with_workers",
    "workers",
    "frontend",
    "after_frontend",
    "benchmark",
)


class ExpandError(ValueError):
    """The recipe is valid on its own but cannot run on this allocation."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


class ExpandGrow(ExpandError):
    """A live edit grows pools past the spare nodes and the recipe allows asking for more:
    `missing` nodes per pool (`carving.GrowNeeded`); the problem is the refusal shown where
    nothing provisions nodes."""

    def __init__(self, problems: list[Problem], missing: dict[str, int]) -> None:
        super().__init__(problems)
        self.missing = missing


def local_allocation(count: int, prefix: str = "node") -> list[tuple[str, str]]:
    """`node1..nodeN` with the local backend's loopback IPs (node K → 127.0.0.(K+1)).

    The dotted quads are worked out here, as `ipaddress` would print them: its address
    objects cost 4 ms for 1,000 nodes, a tenth of a 1,000-node `srtr plan`'s planning.
    """
    base = 0x7F000001  # 127.0.0.1, as an int; the text is str(IPv4Address) of the sum
    out = []
    for k in range(1, count + 1):
        ip = base + k
        out.append((f"{prefix}{k}", f"{ip >> 24}.{(ip >> 16) & 255}.{(ip >> 8) & 255}.{ip & 255}"))
    return out


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LOOPBACK4 = re.compile(rf"127(?:\.{_OCTET}){{3}}")


def one_network(ips: Iterable[str]) -> bool:
    """Whether the nodes share one network stack: every node's address is a loopback one
    (the local backend's 127.0.0.K, or a SLURM cluster of slurmds on one machine), and a
    loopback address is reachable only from its own host. Real nodes, and the separate-host
    test cluster's, have addresses of their own."""
    import ipaddress

    def loopback(ip: str) -> bool:
        if ip == "localhost" or _LOOPBACK4.fullmatch(ip):
            return True  # a dotted quad in 127/8, as `ipaddress` reads one: 20 times faster
        try:
            return ipaddress.ip_address(ip).is_loopback
        except ValueError:  # a host name (NodeAddr unset): a host of its own
            return False

    return all(loopback(ip) for ip in ips)


class _Expander:
    def __init__(self, recipe: Recipe, nodes: NodeMap) -> None:
        self.recipe = recipe
        self.nodes = nodes
        self.ips = {spec.name: spec.ip for spec in nodes.allocation}
        self.one_network = one_network(self.ips.values())
        self.compute_pos = {n: i for i, n in enumerate(nodes.compute)}
        self.resolved = {r.name: r for r in resolve(recipe)}
        self.index_of = {s.name: i for i, s in enumerate(recipe.services)}
        self.warnings: list[str] = []
        self.problems: list[Problem] = []
        self.service_nodes: dict[str, list[str]] = {}
        self.slots = worker_slots(recipe, nodes)
        self._joined: dict[int, tuple[list[str], str, str]] = {}
        self.discovery = discovery_env(list(self.resolved.values()), self.ip_of)
        found = pool_refs.wanted(rendered(recipe))  # other pools' addresses, shared by all
        self.pool_values = dict(pool_refs.values(found, nodes.pools, self.ips))

    def ip_of(self, resolved: Resolved) -> str | None:
        members = self.placement_nodes(resolved)
        return self.ips[members[0]] if members else None

    def discovery_for(self, resolved: Resolved) -> list[tuple[str, str]]:
        return self.discovery if receives_discovery_env(resolved) else []

    def placement_nodes(self, resolved: Resolved) -> list[str]:
        nodes = self.nodes
        if resolved.pool is not None:
            return list(nodes.pools.get(resolved.pool, ()))
        where = resolved.placement
        if where == "head":
            return [nodes.head]
        if where in ("infra", "dedicated"):
            return [nodes.infra]
        if where == "workers":
            return list(nodes.workers)
        if where == "compute":
            return list(nodes.compute)
        if where == "all":
            return list(dict.fromkeys([nodes.head, nodes.infra, nodes.bench, *nodes.compute]))
        return list(nodes.role_nodes.get(where, ()))

    def pool_text(self, members: list[str]) -> tuple[str, str]:
        # Built once per node set, not once per instance: a 4,096-node pool would otherwise
        # join 4,096 names 4,096 times.
        cached = self._joined.get(id(members))
        if cached is None or cached[0] is not members:
            cached = (members, ",".join(members), ",".join(self.ips[m] for m in members))
            self._joined[id(members)] = cached
        return cached[1], cached[2]

    def values(self, node: str, index: int, members: list[str], role: str) -> dict[str, str]:
        return self.node_values(self.shared_values(members, role), node, index)

    def shared_values(self, members: list[str], role: str) -> dict[str, str]:
        """The placeholder values every instance of one node set shares."""
        ips = self.ips
        pool_nodes, pool_ips = self.pool_text(members)
        return {
            "node": "",
            "node_ip": "",
            "listen_ip": "",
            "listen_host": "",
            "node_id": "",
            "index": "",
            "role": role,
            "head_node": self.nodes.head,
            "head_ip": ips[self.nodes.head],
            "infra_node": self.nodes.infra,
            "infra_ip": ips[self.nodes.infra],
            "pool_node": members[0],
            "pool_ip": ips[members[0]],
            "pool_nodes": pool_nodes,
            "pool_ips": pool_ips,
            "pool_node_count": str(len(members)),
            "gpus_per_node": str(self.recipe.resources.gpus_per_node),
            "job_name": self.recipe.name,
            "master_port": str(MOONCAKE_MASTER_PORT),
            "metadata_port": str(MOONCAKE_METADATA_PORT),
            **self.pool_values,
        }

    def node_values(self, shared: dict[str, str], node: str, index: int) -> dict[str, str]:
        values = shared.copy()
        values["node"] = node
        values["node_ip"] = ip = self.ips[node]
        # Where the built-in kinds listen: every address, as srtctl's do, where nodes are
        # separate hosts; the node's own IP where they share one network stack (there a
        # wildcard bind would take the port on every node at once).
        values["listen_ip"] = ip if self.one_network else "0.0.0.0"
        values["listen_host"] = ip if self.one_network else ""
        values["node_id"] = str(self.compute_pos.get(node, index))
        values["index"] = str(index)
        return values

    def service_instances(self, resolved: Resolved) -> list[InstanceSpec]:
        service = resolved.service
        if resolved.external:  # runs elsewhere: its address is in the discovery env
            return []
        members = self.placement_nodes(resolved)
        self.service_nodes[service.name] = members
        if not members:
            self.warnings.append(
                f"services[{service.name}]: placement.node={resolved.placement} "
                "selects no nodes in this allocation; skipping"
            )
            return []
        # Everything that does not depend on the node is worked out once per service: a
        # 1,000-node pool would otherwise redo it 1,000 times (`srtr plan` must stay fast).
        shared = self.shared_values(members, resolved.placement)
        if resolved.per == "worker":
            return self.per_worker_instances(resolved, members, shared)
        keys, discovery = frozenset(shared), self.discovery_for(resolved)
        common = _service_common(resolved, self.recipe, keys, discovery, values=shared)
        # A cluster kind's head (instance 0) has its own argv and probe; the rest share one.
        rest = (
            _service_common(resolved, self.recipe, keys, discovery, index=1, values=shared)
            if resolved.per_instance_shape and len(members) > 1
            else common
        )
        out = []
        # An autoscaled pool's size changes while it runs: its instances are named after
        # their node even alone, so that scaling 1 → 2 adds one and replaces none.
        owner = self.resolved.get(resolved.pool or "")
        bare = len(members) == 1 and (owner is None or owner.service.autoscale is None)
        ips = self.ips
        for index, node in enumerate(members):
            name = f"service_{service.name}" if bare else f"service_{service.name}_{node}"
            shape = rest if index else common
            if shape.same is not None:  # no placeholder values to work out for this node
                out.append(shape.same(name, index, node, ips[node], f"logs/{name}.out"))
            else:
                values = self.node_values(shared, node, index)
                out.append(shape.instance(name, index, node, values))
        return out

    def per_worker_instances(
        self, resolved: Resolved, members: list[str], shared: dict[str, str]
    ) -> list[InstanceSpec]:
        """One instance per engine worker on the placed nodes, in its GPU view."""
        service = resolved.service
        slots = slots_for(self.slots, resolved.placement, members, self.nodes.workers)
        if not slots:
            self.warnings.append(
                f"services[{service.name}]: placement selects no workers in this allocation; "
                "skipping"
            )
            return []
        shared = {**shared, **dict.fromkeys(WORKER_KEYS, "")}
        common = _service_common(
            resolved, self.recipe, frozenset(shared), self.discovery_for(resolved)
        )
        gpus_per_node = self.recipe.resources.gpus_per_node
        out = []
        for index, slot in enumerate(slots):
            values = self.node_values(shared, slot.node, index)
            values.update(slot.values())
            view = slot.gpu_view(gpus_per_node)
            name = f"service_{service.name}_{slot.role}_{slot.index}_{slot.node}"
            gpu_env = {"CUDA_VISIBLE_DEVICES": view} if view is not None else {}
            out.append(common.instance(name, index, slot.node, values, gpu_env))
        return out

    def worker_instances(self) -> list[InstanceSpec]:
        out = []
        by_role: dict[str, list[WorkerSlot]] = {}
        for slot in self.slots:
            by_role.setdefault(slot.role, []).append(slot)
        for role_name, role in roles(self.recipe):
            if role.command is None:
                continue
            members = list(self.nodes.role_nodes[role_name])
            restart = _restart(role.restart) if role.restart else NEVER
            for slot in by_role.get(role_name, []):
                index, node = slot.index, slot.node
                values = self.values(node, index, members, role_name)
                env = layered(self.discovery, self.recipe.environment, role.env)
                name = f"worker_{role_name}_{index}"
                out.append(
                    InstanceSpec(
                        name=name,
                        service=role_name,
                        kind=InstanceKind.WORKER,
                        type="worker",
                        index=index,
                        node=node,
                        node_ip=values["node_ip"],
                        argv=tuple(placeholders.render(a, values) for a in role.command),
                        env=tuple((k, placeholders.render(v, values)) for k, v in env.items()),
                        # srtctl's worker log name: <node>_<role>_w<index>.out
                        log=f"logs/{node}_{role_name}_w{index}.out",
                        stage="workers",
                        shutdown_tier=0,
                        stop_grace_seconds=role.stop_grace_seconds,
                        critical=True,
                        terminal=False,
                        restart=restart,
                        probe=_probe(role.readiness, values),
                    )
                )
        return out

    def frontend_instance(self) -> InstanceSpec | None:
        frontend = self.recipe.frontend
        if frontend_type(self.recipe) == "none" or frontend.command is None:
            return None
        node = self.nodes.head
        values = self.values(node, 0, [node], "head")
        return InstanceSpec(
            name="frontend",
            service="frontend",
            kind=InstanceKind.FRONTEND,
            type="generic",
            index=0,
            node=node,
            node_ip=values["node_ip"],
            argv=tuple(placeholders.render(a, values) for a in frontend.command),
            env=tuple(
                (k, placeholders.render(v, values))
                for k, v in layered(self.discovery, self.recipe.environment).items()
            ),
            log="logs/frontend.out",
            stage="frontend",
            shutdown_tier=0,
            stop_grace_seconds=frontend.stop_grace_seconds,
            critical=True,
            terminal=False,
            restart=NEVER,
            probe=_probe(frontend.readiness, values),
        )

    def benchmark_env(self) -> list[tuple[str, str]]:
        env: dict[str, str] = dict(self.discovery)
        for name in self.resolved:
            members = self.service_nodes.get(name, [])
            if not members:
                continue
            key = env_key(name)
            env[f"SRT_SERVICE_{key}_NODES"], env[f"SRT_SERVICE_{key}_IPS"] = self.pool_text(members)
            env[f"SRT_SERVICE_{key}_NODE_COUNT"] = str(len(members))
        env["SRT_GPUS_PER_NODE"] = str(self.recipe.resources.gpus_per_node)
        role_nodes = [n for ns in self.nodes.role_nodes.values() for n in ns]
        env["SRT_WORKER_NODES"] = ",".join(dict.fromkeys(role_nodes))
        env["SRT_FRONTEND_TYPE"] = frontend_type(self.recipe)
        for role_name, role_members in self.nodes.role_nodes.items():
            env[f"SRT_{role_name.upper()}_NODES"] = ",".join(role_members)
            env[f"SRT_{role_name.upper()}_IPS"] = ",".join(self.ips[m] for m in role_members)
        env.update(self.recipe.environment)
        env.update(self.recipe.benchmark.env)
        return list(env.items())

    def benchmark_instance(self, env: list[tuple[str, str]]) -> InstanceSpec | None:
        bench = self.recipe.benchmark
        if bench.type != "custom" or bench.command is None:
            return None
        node = self.nodes.bench
        return InstanceSpec(
            name="benchmark",
            service="benchmark",
            kind=InstanceKind.BENCHMARK,
            type="custom",
            index=0,
            node=node,
            node_ip=self.ips[node],
            argv=(bench.command,),
            env=tuple(env),
            log="logs/benchmark.out",
            stage="benchmark",
            shutdown_tier=0,
            stop_grace_seconds=30.0,
            critical=False,
            terminal=False,
            restart=NEVER,
            shell=True,
        )

    def path_of(self, service: str, *rest: str) -> Path:
        if service in self.index_of:
            return ("services", self.index_of[service], *rest)
        if service in ("prefill", "decode", "agg"):
            return ("roles", service, *rest)
        if service in ("frontend", "benchmark"):
            return (service, *rest)
        return ("observability", "exporters")

    def exporters(self, instances: list[InstanceSpec]) -> list[ExporterSpec]:
        measured = {r.name for r in self.resolved.values() if r.metrics}
        by_service: dict[str, list[InstanceSpec]] = {}
        for spec in instances if measured else ():  # no loop over 80,000 for no exporter
            if spec.kind is not InstanceKind.SETUP and spec.service in measured:
                by_service.setdefault(spec.service, []).append(spec)
        out = []
        for r in self.resolved.values():
            members = by_service.get(r.name, [])
            # `<endpoint name or kind prefix or service name>_<node>`, srtctl's names:
            # `dcgm_node1`, `node_exporter_node1`, what users' dashboards select on.
            stem = r.kind.metrics_prefix or r.name
            for metrics in r.metrics:
                chosen = members[:1] if metrics.nodes == "first" else members
                for spec in chosen:
                    out.append(
                        ExporterSpec(
                            service=r.name,
                            instance=spec.name,
                            node=spec.node,
                            url=f"http://{spec.node_ip}:{metrics.port}{metrics.path}",
                            name=f"{metrics.name or stem}_{spec.node}",
                        )
                    )
        return out


def expand(
    recipe: Recipe,
    allocation: Sequence[tuple[str, str]],
    previous: NodeMap | None = None,
    provisioned: frozenset[str] = frozenset(),
) -> DesiredState:
    """Every desired object of `recipe` on `allocation` ((name, ip) in allocation order).

    `previous` is the node map of a running job: a live edit keeps running instances where
    they are (see `carving.recarve`).

    Raises:
        ExpandError: the allocation is too short, or two services collide on a port.
    """
    try:
        nodes = carve(recipe, allocation, previous, provisioned)
    except GrowNeeded as exc:
        raise ExpandGrow([Problem(exc.path, str(exc))], exc.missing) from None
    except CarveError as exc:
        raise ExpandError([Problem(exc.path, str(exc))]) from None
    ex = _Expander(recipe, nodes)
    instances, per_phase = _instances_by_phase(recipe, ex)
    instances, graph = start_graph(recipe, instances)
    metrics_ports = {r.name: [m.port for m in r.metrics] for r in ex.resolved.values()}
    ex.problems += collisions.ports(instances, metrics_ports, ex.path_of)
    ex.problems += collisions.names(instances, ex.path_of)
    if ex.problems:
        raise ExpandError(ex.problems)
    owners = [r.service for r in ex.resolved.values() if r.service.nodes is not None]
    return DesiredState(
        job_name=recipe.name,
        nodes=nodes,
        instances=tuple(instances),
        pools=_pools(ex, owners),
        stages=tuple(s for phase in PHASE_ORDER for s in per_phase[phase]),
        exporters=tuple(ex.exporters(instances)),
        benchmark_env=tuple(ex.benchmark_env()),
        frontend_type=frontend_type(recipe),
        terminal_services=tuple(r.name for r in ex.resolved.values() if r.service.terminal),
        warnings=tuple(ex.warnings),
        node_summary=_node_summary(recipe, owners) if owners else (),
        discovery_env=tuple(ex.discovery),
        dependencies=graph,
    )


def _instances_by_phase(
    recipe: Recipe, ex: _Expander
) -> tuple[list[InstanceSpec], dict[str, list[Stage]]]:
    """Every instance, and the launch stages of each start phase, in launch order."""
    per_phase: dict[str, list[Stage]] = {phase: [] for phase in PHASE_ORDER}
    instances: list[InstanceSpec] = []
    with_workers: list[InstanceSpec] = []
    for resolved in ex.resolved.values():
        service = resolved.service
        made = ex.service_instances(resolved)
        if not made:
            continue
        phase = resolved.start
        members, role = ex.service_nodes[service.name], resolved.placement
        values = functools.partial(ex.values, members=members, role=role)
        steps, stages = before_launch(service, made, phase, values, ex.warnings)
        instances += [*steps, *made]
        per_phase[phase] += stages
        # A leader that starts first has a stage of its own, in its phase, before the rest.
        first = made[0].stage.endswith(".leader")  # a service name holds no dot
        if first:
            per_phase[phase].append(Stage(made[0].stage, phase, (made[0].name,)))
        rest = made[1:] if first else made
        if phase == "with_workers":
            with_workers += rest  # launched with the workers, right before them
        elif rest:
            fleet = _fleet(resolved, made)
            per_phase[phase].append(
                Stage(rest[0].stage, phase, tuple(s.name for s in rest), fleet=fleet)
            )
    workers = [*with_workers, *ex.worker_instances()]
    if workers:
        instances += workers[len(with_workers) :]
        per_phase["workers"].append(Stage("workers", "workers", tuple(s.name for s in workers)))
    frontend = ex.frontend_instance()
    if frontend is not None:
        instances.append(frontend)
        per_phase["frontend"].append(Stage("frontend", "frontend", (frontend.name,)))
    bench = ex.benchmark_instance(ex.benchmark_env())
    if bench is not None:
        instances.append(bench)
        per_phase["benchmark"].append(Stage("benchmark", "benchmark", (bench.name,)))
    return instances, per_phase


def _fleet(resolved: Resolved, made: list[InstanceSpec]) -> FleetSpec | None:
    """The kind's fleet gate on the head (instance 0), or None; one instance is a fleet
    already. A recipe's readiness timing applies to the gate too."""
    service = resolved.service
    fleet = resolved.kind.fleet
    if fleet is None or len(made) < 2:
        return None
    port, path = fleet(service.options)
    readiness = service.readiness
    timeout, interval = _timing(made[0].probe)
    return FleetSpec(
        service=service.name,
        url=f"http://{made[0].node_ip}:{port}{path}",
        count=len(made),
        timeout_seconds=readiness.timeout_seconds if readiness else timeout,
        interval_seconds=readiness.interval_seconds if readiness else interval,
        label=f"{service.type.capitalize()} nodes",
    )


def _timing(probe: ProbeSpec | None) -> tuple[float, float]:
    return (probe.timeout_seconds, probe.interval_seconds) if probe else (600.0, 5.0)


def _pools(ex: _Expander, owners: list[Service]) -> tuple[PoolSpec, ...]:
    return tuple(
        PoolSpec(
            name=o.name,
            type=o.type,
            nodes=ex.nodes.pools[o.name],
            riders=tuple(r.name for r in ex.resolved.values() if r.rider and r.pool == o.name),
        )
        for o in owners
    )


def _node_summary(recipe: Recipe, owners: list[Service]) -> tuple[tuple[str, int], ...]:
    summary = [("engine roles", engine_node_count(recipe))]
    summary += [(f"pool {o.name} ({o.type})", o.nodes or 0) for o in owners]
    summary.append(("total", engine_node_count(recipe) + sum(o.nodes or 0 for o in owners)))
    return tuple(summary)
