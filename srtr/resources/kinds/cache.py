"""KV-cache kinds: the Mooncake master, store and donor, and the LMCache server.

Their programs need GPUs (or TensorRT-LLM) and do not install on a plain machine: each kind
names its `binary` (or Python `module`), so an instance whose program is missing is skipped
with one event, as a missing exporter is.

srtr has no engine backends, so srtctl's triggers for these kinds (`engine.mooncake_kv_store`,
vLLM's `connector: lmcache-mp`) do not exist: the services are declared explicitly, and the
rules that read the backend read the declared `mooncake-master` instead.
"""

from __future__ import annotations

from srtr.resources.kinds.base import (
    Kind,
    Options,
    Requirement,
    file_probe,
    http_probe,
    register,
)
from srtr.resources.objects import ProbeKind, ProbeSpec
from srtr.resources.recipe import Readiness, Recipe, Service

MOONCAKE_MASTER_PORT = 8700
MOONCAKE_METADATA_PORT = 8701
MOONCAKE_METRICS_PORT = 8702
TRTLLM_STORE_ROLES = ("both", "producer", "consumer")
# The TensorRT-LLM pool master's defaults (srtctl's TRTLLMMooncakeKVStoreConfig).
TRTLLM_EVICTION_RATIO = 0.05
TRTLLM_MASTER_TIMEOUT_S = 60
# The Mooncake binaries import TensorRT-LLM, which must not join the service's own MPI step.
_MPI_PREFIXES = "PMIX_|PMI_|OMPI_|SLURM_|SLURMD_|MPI_|OPAL_|PRTE_|HYDRA_|I_MPI_"
SCRUB_MPI_ENV = (
    f"for var in $(env | grep -oE '^({_MPI_PREFIXES})[A-Za-z0-9_]*=' | tr -d =); "
    'do unset "$var"; done'
)

Problems = list[tuple[tuple[str | int, ...], str]]


def is_trtllm(options: Options) -> bool:
    """The TensorRT-LLM pool master: srtctl picks it by backend, or by `store_role` in a plan."""
    return "store_role" in options


def _masters(recipe: Recipe) -> list[Service]:
    return [s for s in recipe.services if s.type == "mooncake-master" and s.enabled]


# --- mooncake-master ---------------------------------------------------------------------------


def _master_command(options: Options) -> list[str]:
    if is_trtllm(options):
        return [
            "trtllm-serve",
            "mooncake_master",
            "--rpc_port",
            str(MOONCAKE_MASTER_PORT),
            "--metrics_port",
            str(MOONCAKE_METRICS_PORT),
            "--eviction_ratio",
            str(options.get("eviction_ratio", TRTLLM_EVICTION_RATIO)),
            "--address_file",
            "/logs/mooncake_master.addr",
        ]
    return [
        "mooncake_master",
        f"--port={MOONCAKE_MASTER_PORT}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_port={MOONCAKE_METADATA_PORT}",
        "--eviction_high_watermark_ratio=0.9",
        "--default_kv_lease_ttl=10000",
        "--rpc_thread_num=16",
        "--enable_metric_reporting=true",
        f"--metrics_port={MOONCAKE_METRICS_PORT}",
    ]


def _master_probe(options: Options) -> ProbeSpec:
    ports = (
        (MOONCAKE_METRICS_PORT,)
        if is_trtllm(options)
        else (
            MOONCAKE_METADATA_PORT,
            MOONCAKE_METRICS_PORT,
        )
    )
    fields = Readiness.model_fields  # the recipe model's defaults: 120 s, every 2 s
    return ProbeSpec(
        ProbeKind.TCP,
        fields["timeout_seconds"].default,
        fields["interval_seconds"].default,
        port=MOONCAKE_MASTER_PORT,
        more_ports=ports,
    )


def _master_env(service: Service, recipe: Recipe) -> dict[str, str]:
    if not is_trtllm(service.options):
        return {}
    timeout = service.options.get("master_timeout_s", TRTLLM_MASTER_TIMEOUT_S)
    return {
        "TRTLLM_MOONCAKE_RUN_DIR": "/logs/mooncake/master",
        "TRTLLM_MOONCAKE_MASTER_TIMEOUT": str(timeout),
    }


def _validate_master(service: Service, recipe: Recipe) -> Problems:
    problems: Problems = []
    if _masters(recipe)[0] is not service:
        problems.append(((), "only one mooncake-master service is supported"))
    options = service.options
    timeout = options.get("master_timeout_s", TRTLLM_MASTER_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        problems.append((("options", "master_timeout_s"), "must be a positive integer"))
    ratio = options.get("eviction_ratio", TRTLLM_EVICTION_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio < 1:
        problems.append((("options", "eviction_ratio"), "must be between 0 and 1"))
    role = options.get("store_role", "both")
    if role not in TRTLLM_STORE_ROLES:
        problems.append(
            (
                ("options", "store_role"),
                f"must be one of {', '.join(TRTLLM_STORE_ROLES)}; got '{role}'",
            )
        )
    return problems


register(
    Kind(
        name="mooncake-master",
        default_command=_master_command,
        default_start="before_workers",
        default_critical=True,
        default_placement="infra",
        option_keys=(
            "store_config",
            "device_names_by_gpu",
            "eviction_ratio",
            "master_timeout_s",
            "store_role",
        ),
        binary="mooncake_master",  # or trtllm-serve: the program that argv[0] names
        # srtctl probes 8700, 8701 and 8702 in turn (RPC, metadata, metrics); the TensorRT-LLM
        # master opens no metadata server, so its RPC and metrics ports.
        instance_probe=lambda o, _index: _master_probe(o),
        default_env=_master_env,
        default_srun_options=lambda o: {"mpi": "none"} if is_trtllm(o) else {},
        default_preamble=lambda o: (
            f"mkdir -p /logs/mooncake/master && {SCRUB_MPI_ENV}" if is_trtllm(o) else None
        ),
        validate=_validate_master,
    )
)


# --- mooncake-store ----------------------------------------------------------------------------


def _validate_store(service: Service, recipe: Recipe) -> Problems:
    if _masters(recipe):
        return []
    return [
        (
            ("type",),
            f"services[{service.name}] (type mooncake-store) requires a mooncake-master "
            "service, which launches the master the store registers with",
        )
    ]


register(
    Kind(
        name="mooncake-store",
        default_command=lambda o: ["python", "-m", "mooncake.mooncake_store_service"],
        default_start="before_workers",
        default_critical=True,
        module="mooncake.mooncake_store_service",
        # The recipe may pin a NIC identity by setting it itself.
        default_env=lambda s, r: {"MOONCAKE_LOCAL_HOSTNAME": "{node_ip}"},
        # Where the job's own master listens; a recipe value would point the store elsewhere.
        forced_env=lambda s, r: {
            "MOONCAKE_MASTER": f"{{infra_ip}}:{MOONCAKE_MASTER_PORT}",
            "MOONCAKE_TE_META_DATA_SERVER": f"http://{{infra_ip}}:{MOONCAKE_METADATA_PORT}/metadata",
        },
        validate=_validate_store,
        container_from="mooncake-master",
    )
)


# --- mooncake-donor ----------------------------------------------------------------------------


def _donor_command(options: Options) -> list[str]:
    return [
        "python3",
        "/srtctl-runtime/donor_diagnostics.py",
        "trtllm-serve",
        "mooncake_donor",
        "--master_server_address",
        "file:///logs/mooncake_master.addr",
        "--segment_size",
        str(options.get("size", "")),
        "--protocol",
        str(options.get("protocol", "rdma")),
        "--ready_file",
        "/logs/mooncake/donor-{node}.ready",
    ]


def _donor_env(service: Service, recipe: Recipe) -> dict[str, str]:
    env = {"TRTLLM_MOONCAKE_RUN_DIR": "/logs/mooncake/donor-{node}", "TLLM_LOG_LEVEL": "INFO"}
    trtllm = [m for m in _masters(recipe) if is_trtllm(m.options)]
    if trtllm:
        timeout = trtllm[0].options.get("master_timeout_s", TRTLLM_MASTER_TIMEOUT_S)
        env["TRTLLM_MOONCAKE_MASTER_TIMEOUT"] = str(timeout)
    return env


def _validate_donor(service: Service, recipe: Recipe) -> Problems:
    problems: Problems = []
    if not any(is_trtllm(m.options) for m in _masters(recipe)):
        problems.append(
            (
                ("type",),
                "mooncake-donor requires a TRT-LLM mooncake-master service "
                "(a mooncake-master with options.store_role)",
            )
        )
    if not service.options.get("size"):
        problems.append(
            (("options", "size"), "mooncake-donor requires options.size (for example 640GiB)")
        )
    return problems


register(
    Kind(
        name="mooncake-donor",
        default_command=_donor_command,
        # Donors connect while the workers start, as srtctl's do: launched with the
        # workers, probed once every worker launched.
        default_start="with_workers",
        default_critical=True,
        default_placement="decode",
        option_keys=("size", "protocol"),
        binary="trtllm-serve",
        # Relative to the job's log directory; `{node}` is rendered per instance.
        default_readiness=lambda o: file_probe("mooncake/donor-{node}.ready"),
        default_env=_donor_env,
        default_srun_options=lambda o: {"mpi": "none"},
        default_preamble=lambda o: f"mkdir -p /logs/mooncake/donor-{{node}} && {SCRUB_MPI_ENV}",
        validate=_validate_donor,
        requires=Requirement("node", "decode", "mooncake-donor requires placement.node: decode"),
        container_from="mooncake-master",
    )
)


# --- lmcache-server ----------------------------------------------------------------------------

register(
    Kind(
        name="lmcache-server",
        default_command=lambda o: [
            "lmcache",
            "server",
            "--host",
            "0.0.0.0",
            "--port",
            "8750",
            "--http-host",
            "0.0.0.0",
            "--http-port",
            "8751",
        ],
        default_start="before_workers",
        default_critical=True,
        default_placement="workers",
        binary="lmcache",
        default_readiness=lambda o: http_probe(8751, "/healthcheck", timeout=300.0),
    )
)
