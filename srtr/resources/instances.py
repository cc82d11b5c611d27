"""Recipe service → the InstanceSpec fields its instances share, and the per-node rest.

`expand` builds one `ServiceCommon` per service and asks it for one instance per node (or per
worker). Everything a kind adds (env, probe, preamble, srun options, container) is folded in
here, once per service, so a 1,000-node pool does not redo it 1,000 times. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from srtr.resources import placeholders
from srtr.resources.effective import (
    Resolved,
)
from srtr.resources.liveness import Liveness
from srtr.resources.objects import (
    InstanceKind,
    InstanceSpec,
    ProbeKind,
    ProbeSpec,
    RestartSpec,
    filler,
)
from srtr.resources.recipe import Leader, Readiness, Recipe, RestartPolicy
from srtr.resources.setup_steps import workdir


def restart_spec(policy: RestartPolicy) -> RestartSpec:
    return RestartSpec(
        policy=policy.policy,
        backoff_seconds=policy.backoff_seconds,
        max_backoff_seconds=policy.max_backoff_seconds,
        reset_after_seconds=policy.reset_after_seconds,
        max_restarts=policy.max_restarts,
        window_seconds=policy.window_seconds,
        scope=policy.scope,
    )


NEVER = restart_spec(RestartPolicy(policy="never"))


def probe_spec(readiness: Readiness | None, values: dict[str, str]) -> ProbeSpec | None:
    if readiness is None:
        return None
    spec = _target(readiness, values)
    return ProbeSpec(
        spec.kind,
        readiness.timeout_seconds,
        readiness.interval_seconds,
        port=spec.port,
        path=spec.path,
        status=spec.status,
        pattern=readiness.log.pattern if readiness.log is not None else None,
        failure_threshold=readiness.failure_threshold,
    )


def _target(probe: Readiness | Liveness, values: dict[str, str]) -> ProbeSpec:
    """What the probe kinds of readiness and liveness share: the kind and the target.

    Its timing is a placeholder: the caller builds the probe with its own."""
    if probe.port is not None:
        return ProbeSpec(ProbeKind.TCP, 0, 0, port=probe.port)
    if probe.tcp is not None:
        return ProbeSpec(ProbeKind.TCP, 0, 0, port=probe.tcp.port)
    if probe.http is not None:
        http = probe.http
        return ProbeSpec(ProbeKind.HTTP, 0, 0, port=http.port, path=http.path, status=http.status)
    if isinstance(probe, Readiness) and probe.log is not None:
        return ProbeSpec(ProbeKind.LOG, 0, 0)
    assert probe.file is not None
    return ProbeSpec(ProbeKind.FILE, 0, 0, path=placeholders.render(probe.file.path, values))


def liveness_spec(liveness: Liveness | None, values: dict[str, str]) -> ProbeSpec | None:
    """The liveness probe of one instance: its file path and exec command rendered."""
    if liveness is None:
        return None
    if liveness.exec is not None:
        command = tuple(placeholders.render(a, values) for a in liveness.exec.command)
        target = ProbeSpec(ProbeKind.EXEC, 0, 0, command=command)
    elif liveness.log is not None:
        target = ProbeSpec(ProbeKind.SILENCE, 0, 0, silence_seconds=liveness.log.silence_seconds)
    else:
        target = _target(liveness, values)
    return dataclasses.replace(
        target,
        timeout_seconds=liveness.timeout_seconds,
        interval_seconds=liveness.interval_seconds,
        failure_threshold=liveness.failure_threshold,
        initial_delay_seconds=liveness.initial_delay_seconds,
        max_age_seconds=liveness.file.max_age_seconds if liveness.file is not None else None,
    )


Template = str | None  # a text's placeholder template, None when it names no placeholder
# The placeholder values that differ from one node (or worker) to the next, which
# `expand._Expander.node_values` works out for each.
NODE_KEYS = frozenset({"node", "node_ip", "listen_ip", "listen_host", "node_id", "index"})
# An instance made of its name, index, node, node IP and log (`objects.filler`).
Maker = Callable[[str, int, str, str, str], InstanceSpec]


@dataclass(frozen=True)
class ServiceCommon:
    """What every instance of one service shares; `instance` adds the node's part."""

    readiness: Readiness | None
    liveness: Liveness | None
    argv: list[tuple[str, Template]]
    env: list[tuple[str, str, Template]]
    export_env: list[tuple[str, str, Template]]  # srun_export_env
    preamble: list[str]  # the kind's part, then the recipe's
    probe: ProbeSpec | None  # None with a per-node (file) probe, rendered per instance
    common: dict[str, Any]  # the other InstanceSpec fields, equal for every node
    # When no field depends on the node but its name, index, node and address: the maker
    # of its instances (`same`), which needs no placeholder values.
    same: Maker | None = None

    def instance(
        self,
        name: str,
        index: int,
        node: str,
        values: dict[str, str],
        last_env: dict[str, str] | None = None,
    ) -> InstanceSpec:
        """`last_env` wins over everything (the per-worker GPU view)."""
        env = [(k, t.format_map(values) if t else v) for k, v, t in self.env]
        if last_env:
            env = [(k, v) for k, v in env if k not in last_env] + list(last_env.items())
        # The empty cases skip their loops: most services have neither (5,000 instances).
        preamble = (
            "\n".join(placeholders.render(p, values).rstrip() for p in self.preamble).rstrip()
            if self.preamble
            else ""
        )
        node_probe = self.readiness is not None and self.readiness.file is not None
        return InstanceSpec(
            name=name,
            index=index,
            node=node,
            node_ip=values["node_ip"],
            argv=tuple([t.format_map(values) if t else a for a, t in self.argv]),
            env=tuple(env),
            export_env=tuple([(k, t.format_map(values) if t else v) for k, v, t in self.export_env])
            if self.export_env
            else (),
            log=f"logs/{name}.out",
            probe=probe_spec(self.readiness, values) if node_probe else self.probe,
            liveness=liveness_spec(self.liveness, values) if self.liveness else None,
            preamble=preamble or None,
            **self.common,
        )


def instance_kind(resolved: Resolved) -> InstanceKind:
    if resolved.service.nodes is not None:
        return InstanceKind.OWNER
    return InstanceKind.RIDER if resolved.rider else InstanceKind.SERVICE


def service_env(
    resolved: Resolved, recipe: Recipe, discovery: Sequence[tuple[str, str]] = (), index: int = 1
) -> dict[str, str]:
    """Discovery env < kind default env < recipe env < kind forced env, srtctl's layers
    (docs/design/srtctl-parity.md, "The environment of an instance"); a leader's env
    (instance 0's) goes over the recipe's."""
    service, kind = resolved.service, resolved.kind
    env = dict(discovery)
    if kind.default_env:
        env.update(kind.default_env(service, recipe))
    env.update(service.env)
    if index == 0 and service.leader is not None:
        env.update(service.leader.env)
    if kind.forced_env:
        env.update(kind.forced_env(service, recipe))
    return env


def leader_fields(
    leader: Leader | None, resolved: Resolved
) -> tuple[Readiness | None, Liveness | None]:
    """Instance 0's readiness and liveness probes: each the leader's when it gives one, else
    the service's."""
    readiness, liveness = resolved.readiness, resolved.service.liveness
    if leader is not None:
        readiness = leader.readiness if leader.readiness is not None else readiness
        liveness = leader.liveness if leader.liveness is not None else liveness
    return readiness, liveness


def _preamble(resolved: Resolved) -> list[str]:
    """Shell lines before the command: into the source checkout the service runs in, then
    the kind's preamble and the service's own."""
    service, kind = resolved.service, resolved.kind
    kind_preamble = kind.default_preamble(service.options) if kind.default_preamble else None
    checkout = workdir(service)
    return [
        p for p in (f"cd {checkout}" if checkout else None, kind_preamble, service.preamble) if p
    ]


def service_common(
    resolved: Resolved,
    recipe: Recipe,
    keys: frozenset[str],
    discovery: Sequence[tuple[str, str]] = (),
    index: int = 0,
    values: Mapping[str, str] | None = None,
) -> ServiceCommon:
    """`index` picks the head's (0) or the others' argv and default probe for a kind whose
    head differs (ray). `values`: the placeholder values every node of the service shares
    (`keys` are theirs): given, the result has the maker `same` where it can."""
    service, kind = resolved.service, resolved.kind
    leader = service.leader if index == 0 else None
    readiness, liveness = leader_fields(leader, resolved)
    node_probe = readiness is not None and readiness.file is not None
    probe = None if node_probe else probe_spec(readiness, {})
    if readiness is None and kind.instance_probe is not None:
        probe = kind.instance_probe(service.options, index)
    srun = dict(kind.default_srun_options(service.options)) if kind.default_srun_options else {}
    srun.update(service.srun_options)
    with_workers = resolved.start == "with_workers"
    stage = "workers" if with_workers else f"{resolved.start}/{service.name}"
    if leader is not None and leader.start == "first":  # its own stage, before the others
        stage, with_workers = f"{resolved.start}/{service.name}.leader", False
    shared = ServiceCommon(
        readiness=readiness,
        liveness=liveness,
        probe=probe,
        argv=[(a, placeholders.template(a, keys)) for a in resolved.command(index)],
        env=[
            (k, v, placeholders.template(v, keys))
            for k, v in service_env(resolved, recipe, discovery, index).items()
        ],
        export_env=[
            (k, v, placeholders.template(v, keys)) for k, v in service.srun_export_env.items()
        ],
        preamble=_preamble(resolved),
        common={
            "service": service.name,
            "kind": instance_kind(resolved),
            "type": service.type,
            # with_workers instances launch in the workers stage, probed once all launched
            "stage": stage,
            "deferred_probe": with_workers,
            "shutdown_tier": resolved.tier,
            "stop_grace_seconds": service.stop_grace_seconds,
            "critical": resolved.critical,
            "terminal": service.terminal,
            "restart": restart_spec(resolved.restart),
            "pool": resolved.pool,
            "container": resolved.container,
            "cpus_per_task": service.cpus_per_task,
            "cpu_bind": service.cpu_bind,
            "srun_options": tuple(srun.items()),
            "replace_lost": service.replace_lost,
            "memory_limit": service.limits.memory if service.limits else None,
        },
    )
    return shared if values is None else dataclasses.replace(shared, same=_same(shared, values))


def _same(shared: ServiceCommon, values: Mapping[str, str]) -> Maker | None:
    """The maker of `shared`'s instances when none of their fields but the node's own
    depends on the node: no text names a value of `NODE_KEYS`, and no probe renders one.
    Their argv, env, preamble and probes are then worked out once, with the values every
    node shares (`values`), and are the same objects in every instance."""
    texts = [a for a, _ in shared.argv] + [v for _, v, _ in (*shared.env, *shared.export_env)]
    per_node = any(not NODE_KEYS.isdisjoint(placeholders.named(t)) for t in texts)
    per_node |= any(not NODE_KEYS.isdisjoint(placeholders.named(p)) for p in shared.preamble)
    per_node |= shared.readiness is not None and shared.readiness.file is not None
    live = shared.liveness
    if per_node or (live is not None and (live.exec is not None or live.file is not None)):
        return None
    preamble = "\n".join(placeholders.render(p, values).rstrip() for p in shared.preamble)
    fixed = {
        "argv": tuple([t.format_map(values) if t else a for a, t in shared.argv]),
        "env": tuple([(k, t.format_map(values) if t else v) for k, v, t in shared.env]),
        "export_env": tuple(
            [(k, t.format_map(values) if t else v) for k, v, t in shared.export_env]
        ),
        "preamble": preamble.rstrip() or None,
        "probe": shared.probe,
        "liveness": liveness_spec(live, {}),
        **shared.common,
    }
    return filler(InstanceSpec, ("name", "index", "node", "node_ip", "log"), fixed)
