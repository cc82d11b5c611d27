"""Exporter kinds: host-native Prometheus exporters on every worker node (reference S-43, S-44)."""

from __future__ import annotations

from srtr.resources.kinds.base import Kind, register
from srtr.resources.kinds.base import port_option as _port

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
