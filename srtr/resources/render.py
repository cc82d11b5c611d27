"""DesiredState → the text and JSON that `srtr plan` prints. Pure."""

from __future__ import annotations

import re
import shlex
from typing import Any

from srtr.resources.autoscale import describe_scale
from srtr.resources.effective import Resolved, resolve
from srtr.resources.launchers import Launcher, instance_launcher, own_step_reasons
from srtr.resources.objects import DesiredState, InstanceKind, InstanceSpec
from srtr.resources.recipe import Recipe, Service
from srtr.resources.source import Source

_SECRET = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|PRIVATE", re.IGNORECASE)
MASK = "***"


_GENERATED = re.compile(r"^SRT_[A-Z0-9_]*_(NODES|IPS|NODE_COUNT)$")


def mask(key: str, value: str) -> str:
    """Hide values whose key looks secret, in every output srtr writes.

    srtr's own node lists (`SRT_SERVICE_KEYCLOAK_NODES`) are never secret, whatever the
    service is called.
    """
    if _GENERATED.match(key):
        return value
    return MASK if _SECRET.search(key) else value


def node_map_lines(state: DesiredState) -> list[str]:
    if not state.node_summary:
        return []
    return ["Nodes:", *(f"  {label}: {count}" for label, count in state.node_summary)]


def _metrics_text(resolved: Resolved) -> str:
    parts = []
    for m in resolved.metrics:
        first = "@first" if m.nodes == "first" else ""
        parts.append(f"{m.name or ''}:{m.port}{m.path}{first}")
    return ",".join(parts)


def service_lines(recipe: Recipe) -> list[str]:
    resolved = resolve(recipe)
    if not resolved:
        return []
    lines = ["Services:"]
    for r in resolved:
        service = r.service
        # A rider runs on its owner's pool: say which, not the `workers` word it inherits.
        pool = service.placement.pool if service.placement else None
        where = f"pool={pool}" if pool else f"placement={r.placement}"
        head = (
            f"  {service.name} type={service.type} {where}"
            + (" per=worker" if r.per == "worker" else "")
            + f" start={r.start}"
            f" critical={str(r.critical).lower()}"
        )
        if service.nodes is not None:
            head += f" nodes={service.nodes}"
        if service.autoscale is not None:
            head += f" autoscale={describe_scale(service.autoscale)}"
        if service.terminal:
            head += " terminal"
        if service.external is not None:
            head += f" external={service.external}"
        metrics = _metrics_text(r)
        if metrics:
            head += f" metrics={metrics}"
        scope = "/pool" if r.restart.scope == "pool" else ""
        head += f" restart={r.restart.policy}{scope} tier={r.tier}"
        if service.liveness is not None or (service.leader and service.leader.liveness):
            head += " liveness"
        lines.append(head)
        if r.reason:
            lines.append(
                f"    implied by: {r.reason} (declare a service named {service.name} to change it)"
            )
        if r.container:  # a store borrows its master's
            lines.append(
                f"    container: {r.container} (runs on the host where containers are unsupported)"
            )
        lines += _key_lines(service)
    return lines


def _key_lines(service: Service) -> list[str]:
    """srtctl's dry-run lines for source/build_command, setup, and srun_export_env."""
    lines = []
    if service.source is not None:
        path = f" / source.path: {service.source.path}" if service.source.path else ""
        lines.append(f"    source: {service.source.git} @ {_at(service.source)}{path}")
    if service.build_command is not None:
        lines.append(
            f"    build_command: {shlex.join(service.build_command)} "
            f"(timeout {service.build_timeout_seconds:g}s)"
        )
    if service.setup is not None:
        lines.append(
            f"    setup: on each node before its first instance there "
            f"(timeout {service.setup_timeout_seconds:g}s; logs/setup_{service.name}_<node>.out)"
        )
    lines += [f"    srun_export_env.{k}: {mask(k, v)}" for k, v in service.srun_export_env.items()]
    if service.leader is not None:
        waits = "the others wait for its readiness" if service.leader.start == "first" else ""
        lines.append(
            f"    leader: instance 0 runs the leader, start={service.leader.start}"
            + (f" ({waits})" if waits else " (with the others)")
        )
    return lines


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(map(len, column)) for column in list(zip(*rows, strict=True))[:-1]]
    # Each cell left-justified to its column, the last one as it is: one format per row,
    # not a ljust and a join per cell (5,000 rows for a 1,000-node plan).
    line = "  " + "".join(f"{{:<{w}}}  " for w in widths) + "{}"
    return [line.format(*row).rstrip() for row in rows]


def command_text(argv: tuple[str, ...], shell: bool) -> str:
    return argv[0] if shell else shlex.join(argv)


def _table_command(spec: InstanceSpec, recipe: Recipe, quote: dict[str, str]) -> str:
    """One line per instance: a clone step's script is shown as what it does.

    `quote` memoises `shlex.quote` over one table: a pool's instances share most of their
    arguments, and `command_text` quoted each of them once per instance."""
    if spec.kind is InstanceKind.SETUP and spec.type == "clone":
        source = next(s.source for s in recipe.services if s.name == spec.service)
        if source is not None:
            return f"git clone {source.git} @ {_at(source)} -> services/{spec.service}/src"
    if spec.kind is InstanceKind.SETUP and spec.type == "setup":  # its lines on one line
        return "; ".join(line.strip() for line in spec.argv[0].splitlines() if line.strip())
    if spec.shell:
        return spec.argv[0]
    parts = []
    for arg in spec.argv:
        quoted = quote.get(arg)
        if quoted is None:
            quoted = quote[arg] = shlex.quote(arg)
        parts.append(quoted)
    return " ".join(parts)  # what shlex.join does


def _at(source: Source) -> str:
    """The rev, and the commit it is pinned to when that is not the rev itself."""
    pinned = source.pin is not None and source.pin != source.rev.lower()
    return f"{source.rev} (pinned to {source.pin})" if pinned else source.rev


def _step_reasons(spec: InstanceSpec) -> list[str]:
    """Why `spec` needs an srun step of its own (see `own_step_reasons`)."""
    return own_step_reasons(
        container=spec.container,
        cpus_per_task=spec.cpus_per_task,
        cpu_bind=spec.cpu_bind,
        srun_options=dict(spec.srun_options),
        export_env=dict(spec.export_env),
    )


def launcher_of(spec: InstanceSpec, launcher: Launcher) -> Launcher:
    """The launcher of `spec` in a job whose launcher is `launcher` (`srtr plan --launcher`)."""
    return instance_launcher(launcher, _step_reasons(spec))


def launcher_line(state: DesiredState, launcher: Launcher | None) -> str:
    """Which launcher starts the instances: the one asked for, or the defaults (local: a
    process group; SLURM: the node agent, but a step for what SLURM must set up)."""
    own: dict[str, list[str]] = {}
    # A service's instances share these settings: work the reason out once per distinct set.
    first: dict[tuple[object, ...], str | None] = {}
    for spec in state.instances:
        key = (
            spec.container,
            spec.cpus_per_task,
            spec.cpu_bind,
            spec.srun_options,
            spec.export_env,
        )
        if key not in first:
            reasons = _step_reasons(spec)
            first[key] = reasons[0] if reasons else None
        reason = first[key]
        if reason is not None:
            own.setdefault(reason, []).append(spec.name)
    steps = sum(len(names) for names in own.values())
    mixed = (
        f", except {steps} instance(s) on an srun step of their own ("
        + "; ".join(f"{why}: {', '.join(names)}" for why, names in own.items())
        + ")"
        if steps
        else ""
    )
    if launcher is Launcher.AGENT:
        return f"Launcher: agent (a node agent per node starts its instances){mixed}"
    if launcher is not None:
        return f"Launcher: {launcher}"
    return (
        f"Launcher: process locally; on SLURM the node agent{mixed}"
        " (`srtr up --launcher step`: an srun step each)"
    )


def plan_text(recipe: Recipe, state: DesiredState, launcher: Launcher | None = None) -> str:
    lines = [*service_lines(recipe), *node_map_lines(state)]
    nodes = state.nodes
    lines.append(
        f"Allocation: {len(nodes.allocation)} node(s); head {nodes.head}"
        + (f"; spares {', '.join(nodes.spares)}" if nodes.spares else "")
    )
    for name, members in nodes.pools.items():
        lines.append(f"  Pool {name}: {', '.join(members)}")
    workers = [n for ns in nodes.role_nodes.values() for n in ns]
    lines.append(f"  Worker nodes: {', '.join(workers) if workers else '(none: no engine roles)'}")
    lines.append(launcher_line(state, launcher))
    if state.discovery_env:
        # What every service (unless inherit_discovery_env: false), worker and the benchmark get.
        lines.append("Discovery env:")
        lines += [f"  {k}={v}" for k, v in state.discovery_env]
    if state.instances:
        lines.append(f"Instances ({len(state.instances)}):")
        head = ["NAME", "SERVICE", "KIND", "NODE", "IP", "TIER"]
        rows = [[*head, *(["LAUNCHER"] if launcher else []), "COMMAND"]]
        quote: dict[str, str] = {}
        for spec in state.instances:
            rows.append(
                [
                    spec.name,
                    spec.service,
                    str(spec.kind),
                    spec.node,
                    spec.node_ip,
                    str(spec.shutdown_tier),
                    *([str(launcher_of(spec, launcher))] if launcher else []),
                    _table_command(spec, recipe, quote),
                ]
            )
        lines += _table(rows)
        lines.append("Launch order:")
        for number, stage in enumerate(state.stages, 1):
            line = f"  {number}. {stage.name} ({len(stage.instances)} instance(s))"
            if stage.fleet is not None:
                fleet = stage.fleet
                line += f", then fleet gate: {fleet.count} live nodes at {fleet.url}"
            lines.append(line)
        lines += start_graph_lines(state)
    else:
        lines.append("Instances: none")
    if recipe.benchmark.type == "custom":
        lines.append(f"Benchmark (custom) on {state.nodes.bench}: {recipe.benchmark.command}")
        lines.append("Benchmark env:")
        lines += [f"  {k}={mask(k, v)}" for k, v in state.benchmark_env]
    else:
        ending = (
            f"waits for terminal service(s): {', '.join(state.terminal_services)}"
            if state.terminal_services
            else "holds until stopped (benchmark: manual)"
        )
        lines.append(f"Benchmark: manual; the job {ending}")
    return "\n".join(lines) + "\n"


def plan_json(
    recipe: Recipe, state: DesiredState, launcher: Launcher | None = None
) -> dict[str, Any]:
    doc = _plan_doc(recipe, state)
    if state.discovery_env:  # only jobs with etcd/nats have one
        doc["discovery_env"] = dict(state.discovery_env)
    for spec, record in zip(state.instances, doc["instances"], strict=True):
        if spec.export_env:  # only when set: plans without it stay as they were
            record["srun_export_env"] = {k: mask(k, v) for k, v in spec.export_env}
    if launcher is not None:
        for spec, record in zip(state.instances, doc["instances"], strict=True):
            record["launcher"] = str(launcher_of(spec, launcher))
    if state.dependencies:  # only then: plans without depends_on read as before
        doc["start_graph"] = start_graph_json(state)
    return doc


def start_graph_json(state: DesiredState) -> list[dict[str, Any]]:
    """What waits for what: one entry per service with depends_on, in recipe order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for edge in state.dependencies:
        out.setdefault(edge.service, []).append(
            {"service": edge.on, "condition": edge.condition, "restart": edge.restart}
        )
    return [{"service": name, "waits_for": waits} for name, waits in out.items()]


def start_graph_lines(state: DesiredState) -> list[str]:
    """`Start graph:` lines: each service with depends_on and what it waits for."""
    if not state.dependencies:
        return []
    lines = ["Start graph (depends_on; the other stages start in launch order):"]
    for entry in start_graph_json(state):
        waits = ", ".join(
            f"{w['service']} {w['condition']}" + (" (restarts with it)" if w["restart"] else "")
            for w in entry["waits_for"]
        )
        lines.append(f"  {entry['service']} waits for {waits}")
    return lines


def _plan_doc(recipe: Recipe, state: DesiredState) -> dict[str, Any]:
    nodes = state.nodes
    return {
        "name": recipe.name,
        "nodes": {label: count for label, count in state.node_summary},
        "allocation": [{"name": n.name, "ip": n.ip, "role": n.role} for n in nodes.allocation],
        "head": nodes.head,
        "pools": [
            {"name": p.name, "type": p.type, "nodes": list(p.nodes), "riders": list(p.riders)}
            for p in state.pools
        ],
        "spares": list(nodes.spares),
        "instances": [
            {
                "name": s.name,
                "service": s.service,
                "kind": str(s.kind),
                "pool": s.pool,
                "index": s.index,
                "node": s.node,
                "node_ip": s.node_ip,
                "shutdown_tier": s.shutdown_tier,
                "critical": s.critical,
                "terminal": s.terminal,
                "restart": s.restart.policy,
                "command": list(s.argv),
                "shell": s.shell,
                "env": {k: mask(k, v) for k, v in s.env},
                "preamble": s.preamble,
                "log": s.log,
                "stage": s.stage,
                "probe": s.probe.describe(s.node_ip) if s.probe else None,
                # Only when set: the plans of recipes without them read as before.
                **({"liveness": s.liveness.describe(s.node_ip)} if s.liveness else {}),
                **({"restart_scope": s.restart.scope} if s.restart.scope != "instance" else {}),
                "config_hash": s.config_hash(),
            }
            for s in state.instances
        ],
        "stages": [
            {
                "name": st.name,
                "phase": st.phase,
                "instances": list(st.instances),
                **({"fleet": {"url": st.fleet.url, "count": st.fleet.count}} if st.fleet else {}),
            }
            for st in state.stages
        ],
        "exporters": [
            {"service": e.service, "node": e.node, "url": e.url, "name": e.name}
            for e in state.exporters
        ],
        "benchmark": {
            "type": recipe.benchmark.type,
            "env": {k: mask(k, v) for k, v in state.benchmark_env},
        },
        "terminal_services": list(state.terminal_services),
        "warnings": [*state.warnings, *state.line_warnings],
    }
