"""Resource objects that `expand` produces and controllers reconcile: the desired state.

Specs are frozen dataclasses (cheap to build by the thousand, hashable, comparable). Status
lives in the reconciler's store, never here.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


def _fills_slots(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an `__init__` that fills its slots directly.

    The dataclass's own goes through `object.__setattr__` once per field (the way past
    `frozen`), which made a third of `expand`'s time for a 5,000-instance plan; a slot's
    descriptor sets it for less than half of that. Same signature, defaults and result.
    """
    params, lines, names = [], [], {}
    for number, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        # Only what the plain form covers: no factories, no init=False, no __post_init__.
        assert f.init and f.default_factory is dataclasses.MISSING, f.name
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            names[f"_default{number}"] = f.default
            params.append(f"{f.name}=_default{number}")
        names[f"_set{number}"] = cls.__dict__[f.name].__set__
        lines.append(f"    _set{number}(self, {f.name})")
    assert not hasattr(cls, "__post_init__"), cls
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines) + "\n"
    exec(source, names)  # as dataclasses itself builds __init__
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def filler(cls: type[_T], own: Sequence[str], fixed: Mapping[str, Any]) -> Callable[..., _T]:
    """A maker of `cls` (a frozen, slotted dataclass) objects that differ only in the fields
    `own`, taken positionally in that order: each is `cls(*own, **fixed)`, every other field
    its default. It fills the slots directly, with no keywords to match: half the time of
    the `__init__`, for the tens of thousands of instances of one service that a pool has."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in fields}
    assert set(own) <= names and set(fixed) <= names and not set(own) & set(fixed), cls
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = ["    made = _new(_cls)"]
    for number, f in enumerate(fields):
        scope[f"_set{number}"] = cls.__dict__[f.name].__set__
        if f.name in own:
            value = f.name
        else:
            default = fixed.get(f.name, f.default)
            assert default is not dataclasses.MISSING, f.name
            scope[f"_value{number}"] = default
            value = f"_value{number}"
        lines.append(f"    _set{number}(made, {value})")
    source = f"def make({', '.join(own)}):\n" + "\n".join(lines) + "\n    return made\n"
    exec(source, scope)  # as `_fills_slots` builds its __init__
    make: Callable[..., _T] = scope["make"]
    return make


class InstanceKind(enum.StrEnum):
    OWNER = "owner"
    RIDER = "rider"
    SERVICE = "service"
    WORKER = "worker"
    FRONTEND = "frontend"
    BENCHMARK = "benchmark"
    # A one-shot step of a service before it launches (source clone, build_command): its
    # stage passes when it exits 0 within `run_timeout_seconds`.
    SETUP = "setup"


class ProbeKind(enum.StrEnum):
    TCP = "tcp"
    HTTP = "http"
    LOG = "log"
    FILE = "file"
    # Liveness only: a command on the instance's node, and the log's silence (a hang).
    EXEC = "exec"
    SILENCE = "silence"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    ip: str
    role: str  # worker | pool:<name> | dedicated | spare


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    kind: ProbeKind
    timeout_seconds: float
    interval_seconds: float
    port: int | None = None
    path: str | None = None  # http path, or the file probe's path (rendered)
    status: int | None = None
    pattern: str | None = None
    # A tcp probe passes once `port` and then each of these accept, in turn (a server that
    # opens several ports, such as mooncake-master's 8700, 8701, 8702).
    more_ports: tuple[int, ...] = ()
    # Liveness (then `timeout_seconds` bounds one attempt) and readiness after the gate.
    failure_threshold: int = 3
    initial_delay_seconds: float = 0.0
    command: tuple[str, ...] = ()  # exec
    max_age_seconds: float | None = None  # a heartbeat file: its mtime younger than this
    silence_seconds: float | None = None  # silence: the log written within this

    def describe(self, ip: str = "<node_ip>") -> str:
        """Short text used in plan output and in readiness failure messages."""
        if self.kind is ProbeKind.TCP:
            # With the address, as the probe's own messages say it (`tcp 10.0.0.2:9000:
            # connection refused`): a port alone does not say which node is probed.
            host = f"[{ip}]" if ":" in ip else ip
            return f"tcp {host}:" + ",".join(str(p) for p in (self.port, *self.more_ports))
        if self.kind is ProbeKind.HTTP:
            return f"http://{ip}:{self.port}{self.path} -> {self.status}"
        if self.kind is ProbeKind.LOG:
            return f"log matches /{self.pattern}/"
        if self.kind is ProbeKind.EXEC:
            return "exec " + " ".join(self.command)
        if self.kind is ProbeKind.SILENCE:
            return f"log written within {self.silence_seconds:g}s"
        if self.max_age_seconds is not None:
            return f"file {self.path} touched within {self.max_age_seconds:g}s"
        return f"nonempty file {self.path}"


@dataclass(frozen=True, slots=True)
class RestartSpec:
    policy: str
    backoff_seconds: float
    max_backoff_seconds: float
    reset_after_seconds: float
    max_restarts: int
    window_seconds: float
    scope: str = "instance"  # or "pool": a failure restarts the owner's whole pool


@_fills_slots  # built by the thousand: 5,000 for a 1,000-node `srtr plan`
@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One process of a service on one node: one srun step on SLURM, one process group here.

    `name` is the step name and the log stem (`service_<name>[_<node>]`, as srtctl's), so it is
    deterministic and unique within the job.
    """

    name: str
    service: str
    kind: InstanceKind
    type: str
    index: int
    node: str
    node_ip: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    log: str  # relative to the run dir
    stage: str  # the launch stage it belongs to (see DesiredState.stages)
    shutdown_tier: int
    stop_grace_seconds: float
    critical: bool
    terminal: bool
    restart: RestartSpec
    probe: ProbeSpec | None = None
    pool: str | None = None
    preamble: str | None = None
    shell: bool = False
    container: str | None = None
    cpus_per_task: int | None = None
    cpu_bind: str | None = None
    srun_options: tuple[tuple[str, str], ...] = ()
    replace_lost: bool = False
    # SETUP steps: killed, and the job failed, when still running this long after launch.
    run_timeout_seconds: float | None = None
    # `start: with_workers`: probed only once every member of its stage has launched.
    deferred_probe: bool = False
    # srun_export_env: reaches the instance through srun's --export, never through argv.
    export_env: tuple[tuple[str, str], ...] = ()
    # `limits.memory` in bytes: the instance's memory cgroup (and srun's --mem).
    memory_limit: int | None = None
    # Restarted when it fails `failure_threshold` times in a row; not in the config hash
    # (its timing and target change live).
    liveness: ProbeSpec | None = None
    # An init service's (one depended on with `depends_on: {condition: completed}`): its
    # exit 0 is its success, not an exit before its readiness probe passed.
    run_to_completion: bool = False

    def config_hash(self) -> str:
        """What decides a restart on a live edit: rendered argv, env, preamble and probe target.

        Probe timings, restart policy, tier and grace are not in it: they change live
        ("hot") without touching the process.
        """
        import hashlib  # here: loading OpenSSL costs `srtr plan`, which hashes nothing (text)

        probe = self.probe
        target: tuple[object, ...] | None = None
        if probe is not None:
            target = (probe.kind, probe.port, probe.path, probe.status, probe.pattern)
            if probe.more_ports:  # only then: every other hash stays what it was
                target = (*target, probe.more_ports)
        payload = json.dumps(
            [
                self.argv,
                self.env,
                self.preamble,
                self.shell,
                self.container,
                self.node,
                target,
                # srun settings are part of how the process is started
                *(
                    [self.cpus_per_task, self.cpu_bind, self.srun_options]
                    if self.cpus_per_task or self.cpu_bind or self.srun_options
                    else []
                ),
                *([self.export_env] if self.export_env else []),
                *([self.memory_limit] if self.memory_limit else []),
            ],
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    type: str
    nodes: tuple[str, ...]
    riders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ExporterSpec:
    """One Prometheus scrape target: one (metrics endpoint, node) of a service."""

    service: str
    instance: str
    node: str
    url: str
    name: str


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """A gate on a whole service once each of its instances is ready (a Ray cluster).

    The stage holds until `url` (the head's node list) shows `count` live members; a member
    that exits meanwhile fails it at once, and so does `timeout_seconds` without them.
    """

    service: str
    url: str
    count: int
    timeout_seconds: float
    interval_seconds: float
    label: str = "nodes"  # what messages count: "Ray nodes"


@dataclass(frozen=True, slots=True)
class Stage:
    """A launch step: its instances start together; the next stage waits until all are ready.

    `phase` is before_workers | workers | frontend | after_frontend | benchmark | infra.
    """

    name: str
    phase: str
    instances: tuple[str, ...]
    fleet: FleetSpec | None = None  # a whole-service gate after every member is ready


@dataclass(frozen=True, slots=True)
class DependencySpec:
    """One `depends_on` edge: `service` starts once `condition` holds on `on`.

    `instances` are the dependency's (its setup steps excluded), `dependents` the
    dependent's: what the condition is judged on, and what a `restart` restarts.
    """

    service: str
    on: str
    condition: str  # ready | started | completed
    restart: bool
    instances: tuple[str, ...]
    dependents: tuple[str, ...]


@dataclass(frozen=True)
class NodeMap:
    """How the allocation was carved (`carving.carve`)."""

    allocation: tuple[NodeSpec, ...]
    workers: tuple[str, ...]
    pools: dict[str, tuple[str, ...]]
    reserved: tuple[str, ...]
    spares: tuple[str, ...]
    head: str
    bench: str
    infra: str
    role_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    lost: tuple[str, ...] = ()  # nodes lost during the run: never used again

    @property
    def compute(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.workers, *(n for p in self.pools.values() for n in p)]))

    def to_json(self) -> dict[str, Any]:
        return {
            "workers": list(self.workers),
            "pools": {k: list(v) for k, v in self.pools.items()},
            "reserved": list(self.reserved),
            "spares": list(self.spares),
            "head": self.head,
            "bench": self.bench,
            "infra": self.infra,
            "role_nodes": {k: list(v) for k, v in self.role_nodes.items()},
            "lost": list(self.lost),
        }

    @classmethod
    def from_json(cls, carve: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> NodeMap:
        """The carve of state.json (`carve`, `nodes`) back as a NodeMap."""
        return cls(
            allocation=tuple(NodeSpec(n["name"], n["ip"], n.get("state", "")) for n in nodes),
            workers=tuple(carve["workers"]),
            pools={k: tuple(v) for k, v in carve["pools"].items()},
            reserved=tuple(carve["reserved"]),
            spares=tuple(carve["spares"]),
            head=carve["head"],
            bench=carve["bench"],
            infra=carve["infra"],
            role_nodes={k: tuple(v) for k, v in carve["role_nodes"].items()},
            lost=tuple(carve.get("lost", ())),
        )

    def ip(self, node: str) -> str:
        for spec in self.allocation:
            if spec.name == node:
                return spec.ip
        raise KeyError(node)


@dataclass(frozen=True)
class DesiredState:
    """Everything `expand` derives from a recipe and an allocation."""

    job_name: str
    nodes: NodeMap
    instances: tuple[InstanceSpec, ...]
    pools: tuple[PoolSpec, ...]
    stages: tuple[Stage, ...]
    exporters: tuple[ExporterSpec, ...]
    benchmark_env: tuple[tuple[str, str], ...]
    frontend_type: str
    terminal_services: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    # Warnings found with their recipe line (placeholder typos), as `FILE:LINE: warning:
    # path: message` lines, printed as they are.
    line_warnings: tuple[str, ...] = ()
    node_summary: tuple[tuple[str, int], ...] = ()  # the `Nodes:` map lines, in order
    # ETCD_ENDPOINTS / NATS_SERVER as the job's services, workers and benchmark get them.
    discovery_env: tuple[tuple[str, str], ...] = ()
    # `depends_on` edges (`dependencies.start_graph`); their dependents' stages leave the chain.
    dependencies: tuple[DependencySpec, ...] = ()

    def instance(self, name: str) -> InstanceSpec:
        for spec in self.instances:
            if spec.name == name:
                return spec
        raise KeyError(name)
