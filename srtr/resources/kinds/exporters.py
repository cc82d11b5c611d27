"""Exporter kinds: host-native Prometheus exporters on every worker node."""

from __future__ import annotations

from srtr.resources.kinds.base import Kind, Options, check_positive_ints, options_rule, register
from srtr.resources.kinds.base import port_option as _port

register(
    Kind(
        name="node-exporter",
        # `{listen_host}`: every address (`:9101`, as srtctl's) where nodes are separate
        # hosts; the node's own IP where they share one network stack (the local backend),
        # where a wildcard bind would collide on the second node.
        default_command=lambda o: [
            "prometheus-node-exporter",
            f"--web.listen-address={{listen_host}}:{_port(o, 9101)}",
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
            f"{{listen_host}}:{_port(o, 9401)}",
        ],
        default_placement="workers",
        option_keys=("port", "collect_interval_ms"),
        default_metrics_port=lambda o: _port(o, 9401),
        metrics_prefix="dcgm",
        binary="dcgm-exporter",
    )
)

# One group per process name: what every process on the node costs, by command. srtctl's
# group file names its own processes (`dynamo\.frontend`, ...); srtr runs arbitrary commands,
# so it groups all of them by their `comm` instead.
PROCESS_EXPORTER_CONFIG = "process-exporter.yml"
PROCESS_EXPORTER_GROUPS = """\
# Written by srtr before the process exporters start (the process-exporter kind).
process_names:
  - name: "{{.Comm}}"
    cmdline:
      - '.+'
"""


def _check_process_exporter(o: Options) -> list[str]:
    out = check_positive_ints(o, ("port",), 65535)
    binary = o.get("binary", "x")
    if not (isinstance(binary, str) and binary.strip()):
        out.append(f"options.binary must be a non-empty program name; got {binary!r}")
    return out


def _process_exporter_binary(o: Options) -> str:
    binary = o.get("binary")
    return binary if isinstance(binary, str) and binary.strip() else "prometheus-process-exporter"


register(
    Kind(
        name="process-exporter",
        # The group file is in the run dir (written by the runtime before launch); the
        # preamble `cd`s there, because an argv is never expanded by a shell.
        default_command=lambda o: [
            _process_exporter_binary(o),
            "-config.path",
            PROCESS_EXPORTER_CONFIG,
            f"-web.listen-address={{listen_host}}:{_port(o, 9256)}",
            "-threads=true",
            "-children=false",
            "-recheck=false",
        ],
        default_placement="all",
        option_keys=("port", "binary"),
        default_metrics_port=lambda o: _port(o, 9256),
        metrics_prefix="process_exporter",
        binary="prometheus-process-exporter",
        default_preamble=lambda o: 'cd "$SRTR_RUN_DIR"',
        validate=options_rule(_check_process_exporter),
        run_files=((PROCESS_EXPORTER_CONFIG, PROCESS_EXPORTER_GROUPS),),
    )
)
