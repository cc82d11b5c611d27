"""The discovery plane: `etcd` and `nats` on the infra node.

What differs from srtctl's, and why:
- the Debian binaries (`etcd`, `nats-server`) on PATH, not `/configs/...` inside a container;
- data dirs live in the run dir, one per node (`data/etcd-<node>`): srtctl's `/tmp/etcd` is
  per node on a cluster, but simulated nodes share one machine and would share the dir. The
  preamble `cd`s into the run dir (`$SRTR_RUN_DIR`, set for every instance) so the paths in the
  argv stay relative and the argv keeps srtctl's shape;
- where nodes share one network stack (the local backend), every listener binds the node's
  own IP, not 0.0.0.0 (see kinds/exporters.py); where they are separate hosts, the client
  listeners take every address as srtctl's do (`{listen_ip}`). The ports are options (`port`,
  etcd's `peer_port`) so that two jobs on one machine need not collide.
"""

from __future__ import annotations

from srtr.resources.kinds.base import (
    Kind,
    Options,
    check_positive_ints,
    options_rule,
    register,
    tcp_probe,
)
from srtr.resources.kinds.base import port_option as _port

ETCD_PORT = 2379
ETCD_PEER_PORT = 2380
NATS_PORT = 4222
# srtctl's readiness timeout for both: a cold etcd can take a while.
TIMEOUT = 300.0
PLACEMENTS = ("head", "infra", "dedicated")
MB = 1024 * 1024


def _etcd_command(o: Options) -> list[str]:
    port, peer = _port(o, ETCD_PORT), _port(o, ETCD_PEER_PORT, "peer_port")
    return [
        "etcd",
        "--data-dir",
        "data/etcd-{node}",
        "--listen-client-urls",
        f"http://{{listen_ip}}:{port}",
        "--advertise-client-urls",
        f"http://{{node_ip}}:{port}",
        # etcd's default peer listener is localhost:2380: a second etcd on the machine would
        # fail to bind it.
        "--listen-peer-urls",
        f"http://{{node_ip}}:{peer}",
    ]


def _max_payload(o: Options) -> int | None:
    value = o.get("max_payload_mb")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _nats_command(o: Options) -> list[str]:
    if _max_payload(o) is not None:
        base = ["nats-server", "-c", "data/nats-{node}.conf"]
    else:
        base = ["nats-server", "-js", "-sd", "data/nats-{node}"]
    return [*base, "-a", "{listen_ip}", "-p", str(_port(o, NATS_PORT))]


def _nats_preamble(o: Options) -> str:
    text = 'cd "$SRTR_RUN_DIR" && rm -rf data/nats-{node} && mkdir -p data/nats-{node}'
    payload = _max_payload(o)
    if payload is None:
        return text
    # srtctl's /tmp/nats.conf: the payload limit, and JetStream on the same store dir.
    lines = [f"max_payload: {payload * MB}", "jetstream {", '  store_dir: "data/nats-{node}"', "}"]
    quoted = " ".join(f"'{line}'" for line in lines)
    return f"{text} && printf '%s\\n' {quoted} > data/nats-{{node}}.conf"


register(
    Kind(
        name="etcd",
        default_command=_etcd_command,
        default_start="infra",
        default_critical=True,
        default_placement="infra",
        option_keys=("port", "peer_port"),
        supports_dedicated=True,
        supports_external=True,
        placements=PLACEMENTS,
        default_readiness=lambda o: tcp_probe(_port(o, ETCD_PORT), TIMEOUT),
        default_preamble=lambda o: (
            'cd "$SRTR_RUN_DIR" && rm -rf data/etcd-{node} && mkdir -p data/etcd-{node}'
        ),
        discovery=lambda ip, o: ("ETCD_ENDPOINTS", f"http://{ip}:{_port(o, ETCD_PORT)}"),
        validate=options_rule(lambda o: check_positive_ints(o, ("port", "peer_port"), 65535)),
    )
)

register(
    Kind(
        name="nats",
        default_command=_nats_command,
        default_start="infra",
        default_critical=True,
        default_placement="infra",
        option_keys=("port", "max_payload_mb"),
        supports_dedicated=True,
        supports_external=True,
        placements=PLACEMENTS,
        default_readiness=lambda o: tcp_probe(_port(o, NATS_PORT), TIMEOUT),
        default_preamble=_nats_preamble,
        discovery=lambda ip, o: ("NATS_SERVER", f"nats://{ip}:{_port(o, NATS_PORT)}"),
        validate=options_rule(
            lambda o: [
                *check_positive_ints(o, ("port",), 65535),
                *check_positive_ints(o, ("max_payload_mb",)),
            ]
        ),
    )
)
