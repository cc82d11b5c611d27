"""Service kinds: what a `type:` brings (default command, phase, placement, metrics).

Kinds register themselves by name, like the older system's `@register_service` (reference
§2.1). srtr ships `generic` and the two exporters; each is a frozen value, not a class
hierarchy, because a kind here only supplies defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Options = Mapping[str, Any]


@dataclass(frozen=True)
class Kind:
    name: str
    default_command: Callable[[Options], list[str]] | None = None
    default_start: str = "after_frontend"
    default_critical: bool = False
    default_placement: str = "head"
    option_keys: tuple[str, ...] = ()
    default_metrics_port: Callable[[Options], int] | None = None
    # The endpoint name's stem in the targets file, `<prefix>_<node>` (reference S-36
    # `metrics_endpoint_prefix`, S-110); None: the service name.
    metrics_prefix: str | None = None
    binary: str | None = None

    @property
    def needs_command(self) -> bool:
        return self.default_command is None


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> Kind | None:
    return KINDS.get(name)


def _port(options: Options, default: int) -> int:
    value = options.get("port", default)
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else default


register(Kind(name="generic"))

register(
    Kind(
        name="node-exporter",
        # Bound to the node's own IP: on one machine every simulated node shares the kernel,
        # so a wildcard bind would collide on the second node.
        default_command=lambda o: [
            "prometheus-node-exporter",
            f"--web.listen-address={{node_ip}}:{_port(o, 9101)}",
        ],
        default_placement="workers",
        option_keys=("port",),
        default_metrics_port=lambda o: _port(o, 9101),
        metrics_prefix="node_exporter",
        binary="prometheus-node-exporter",
    )
)

register(
    Kind(
        name="dcgm-exporter",
        default_command=lambda o: [
            "dcgm-exporter",
            f"--collect-interval={o.get('collect_interval_ms', 1000)}",
            "--address",
            f"{{node_ip}}:{_port(o, 9401)}",
        ],
        default_placement="workers",
        option_keys=("port", "collect_interval_ms"),
        default_metrics_port=lambda o: _port(o, 9401),
        metrics_prefix="dcgm",
        binary="dcgm-exporter",
    )
)
