"""`ray`: a Ray cluster over the service's nodes, head on the first.

Instance 0 runs `ray start --head`; every other instance waits for the head's GCS port and
joins it. Readiness is per instance (head: the dashboard's `/api/version`; members: their
`Ray runtime started` line), then the fleet gate holds the stage until the head's dashboard
lists every instance as an ALIVE raylet (`fleet`).

The dashboard binds to `{listen_ip}`, as the exporters do (kinds/exporters.py): 0.0.0.0, as
srtctl's, where nodes are separate hosts; the node's own IP on the local backend, where every
simulated node shares one network namespace, so a wildcard bind would take the port on every
simulated node at once.
Ray's own agent ports (node manager, object manager, metrics export, dashboard agent gRPC,
runtime env agent) stay at Ray's defaults, which are random free ports, and its session dir
lives under the node's private /tmp (the local backend gives each simulated node its own),
so several Ray nodes on one machine do not collide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from srtr.resources.kinds.base import Kind, KindProblem, Options, register
from srtr.resources.objects import ProbeKind, ProbeSpec

if TYPE_CHECKING:
    from srtr.resources.recipe import Recipe, Service

OPTION_KEYS = ("port", "dashboard_port", "num_gpus")
DEFAULTS = {"port": 6379, "dashboard_port": 8265}
PLACEMENTS = ("head", "workers", "all")
TIMEOUT_SECONDS = 600.0
INTERVAL_SECONDS = 5.0
# How long a member waits for the head's GCS port before it tries to join anyway (60 × 5 s).
WAIT_TRIES, WAIT_SECONDS = 60, 5
STARTED = "Ray runtime started"


def _int(options: Options, key: str) -> int:
    value = options.get(key, DEFAULTS.get(key))
    # validate() refuses anything but a positive int before any plan is made
    return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULTS[key]


def _gpus(options: Options) -> str:
    """`--num-gpus`: the option, else the recipe's gpus_per_node (a placeholder)."""
    value = options.get("num_gpus")
    return str(value) if isinstance(value, int) else "{gpus_per_node}"


def _command(options: Options, index: int) -> list[str]:
    port, gpus = _int(options, "port"), _gpus(options)
    if index == 0:
        return [
            "ray",
            "start",
            "--head",
            f"--port={port}",
            "--dashboard-host={listen_ip}",
            f"--dashboard-port={_int(options, 'dashboard_port')}",
            "--node-ip-address={node_ip}",
            f"--num-gpus={gpus}",
            "--disable-usage-stats",
            "--block",
        ]
    # The recipe's args follow as "$@" ($0 is the name), so they are never re-split by bash.
    script = (
        f"for _ in $(seq {WAIT_TRIES}); do "
        f"(exec 3<>/dev/tcp/{{pool_ip}}/{port}) 2>/dev/null && break; sleep {WAIT_SECONDS}; "
        "done; "
        f"exec ray start --address={{pool_ip}}:{port} --node-ip-address={{node_ip}} "
        f'--num-gpus={gpus} --disable-usage-stats --block "$@"'
    )
    return ["bash", "-c", script, "ray-join"]


def _probe(options: Options, index: int) -> ProbeSpec:
    if index == 0:
        return ProbeSpec(
            ProbeKind.HTTP,
            TIMEOUT_SECONDS,
            INTERVAL_SECONDS,
            port=_int(options, "dashboard_port"),
            path="/api/version",
            status=200,
        )
    return ProbeSpec(ProbeKind.LOG, TIMEOUT_SECONDS, INTERVAL_SECONDS, pattern=STARTED)


def _env(service: Service, recipe: Recipe) -> dict[str, str]:
    value = service.options.get("num_gpus")
    gpus = value if isinstance(value, int) else recipe.resources.gpus_per_node
    # Ray's memory monitor kills workers under memory pressure it misreads inside
    # containers; srtctl turns it off, and so do we.
    env = {"RAY_memory_monitor_refresh_ms": "0"}
    if gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(k) for k in range(gpus))
    return env


def _validate(service: Service, _recipe: Recipe) -> list[KindProblem]:
    problems: list[KindProblem] = []
    placement = service.placement
    on_pool = service.nodes is not None or bool(placement and placement.pool)
    where = placement.node if placement is not None else None
    if not on_pool and where is not None and where not in PLACEMENTS:
        problems.append(
            (
                ("placement", "node"),
                f"type ray must be placed on head, workers, or all (or own or join a pool); "
                f"got '{where}'",
            )
        )
    if service.command is not None:
        problems.append(
            (
                ("command",),
                "type ray builds its own command (`ray start --head` on the first node, "
                "`ray start --address=<head>` on the others); add flags with args",
            )
        )
    for key in OPTION_KEYS:
        if key not in service.options:
            continue
        value = service.options[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append((("options", key), f"must be a positive integer; got {value!r}"))
    return problems


register(
    Kind(
        name="ray",
        default_start="before_workers",
        default_critical=True,
        default_placement="workers",
        option_keys=OPTION_KEYS,
        instance_command=_command,
        instance_probe=_probe,
        default_env=_env,
        validate=_validate,
        fleet=lambda o: (_int(o, "dashboard_port"), "/nodes?view=summary"),
    )
)
