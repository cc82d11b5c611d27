"""srtctl's service-kind and per-worker test cases, ported to srtr at plan level.

The reference's §11.3 (T-40..T-62, T-77, T-78), §11.5 (T-90..T-96) and the plan-level parts
of §11.7 (T-120..T-123): what `srtr plan` derives for each kind (argv, env, probe, placement,
phase, criticality) and the messages bad recipes get. The cache and GPU kinds' programs do
not install here, so their runtime side is the skip tested at the end (a missing program is
an event, not a crash); `placement.per: worker` also runs for real in
tests/e2e/local/test_per_worker.py.

srtctl's disagg head (prefill 1 node, decode 2 nodes) becomes roles on node1..node3 here:
prefill on node1, decode on node2 and node3, and the head (and infra) node is node1.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import pytest

from srtr.controllers import exporter
from srtr.resources.effective import effective_services
from srtr.resources.errors import RecipeError, format_path
from srtr.resources.kinds import KINDS, get_kind
from srtr.resources.kinds.cache import SCRUB_MPI_ENV
from srtr.resources.objects import DesiredState, InstanceSpec, ProbeKind
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Recipe
from srtr.resources.render import plan_text
from tests.support.controller_harness import Harness

DISAGG = """\
name: kinds
resources:
  gpus_per_node: 8
roles:
  prefill: {nodes: 1, command: [sleep, inf]}
  decode: {nodes: 2, command: [sleep, inf]}
"""


def plan(text: str) -> tuple[Recipe, DesiredState]:
    return plan_text_source(textwrap.dedent(text), "recipe.yaml")


def state(text: str) -> DesiredState:
    return plan(text)[1]


def services(text: str) -> list[InstanceSpec]:
    return [s for s in state(text).instances if s.kind in ("service", "owner", "rider")]


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(RecipeError) as info:
        plan(text)
    return [(format_path(p.path), p.message) for p in info.value.problems]


def disagg(services_yaml: str) -> str:
    return DISAGG + "services:\n" + textwrap.indent(textwrap.dedent(services_yaml), "  ")


# --- §11.3: kinds and the generic service -------------------------------------------------------


def test_t40_every_kind_this_module_covers_is_registered() -> None:
    # Other kinds (etcd, nats, ray, process-exporter) register from their own modules.
    ours = {"generic", "dcgm-exporter", "node-exporter"}
    ours |= {"mooncake-master", "mooncake-store", "mooncake-donor", "lmcache-server", "gms"}
    assert ours <= set(KINDS)


def test_t41_generic_defaults() -> None:
    recipe, _ = plan(disagg("- {name: router, command: [r], readiness: {port: 9000}}"))
    [(service, reason)] = effective_services(recipe)
    assert (service.type, reason) == ("generic", None)
    [spec] = services(disagg("- {name: router, command: [r], readiness: {port: 9000}}"))
    assert (spec.node, spec.stage, spec.critical) == ("node1", "after_frontend/router", False)
    assert spec.probe is not None and (spec.probe.kind, spec.probe.port) == (ProbeKind.TCP, 9000)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param(
            "- {name: r}", ("services[0].command", "is required for type 'generic'"), id="t42"
        ),
        pytest.param(
            "- {name: r, type: tachometer, command: [x]}",
            ("services[0].type", "'tachometer' is not a known service type"),
            id="t43",
        ),
        pytest.param(
            "- {name: r, command: [x]}\n- {name: r, command: [y]}",
            ("services[1].name", "must be unique; duplicate: 'r'"),
            id="t44",
        ),
        pytest.param(
            "- {name: r, command: [x], placement: {node: rack}}",
            ("services[0].placement.node", "must be one of head, infra"),
            id="t45-placement",
        ),
        pytest.param(
            "- {name: r, command: [x], start: soon}",
            ("services[0].start", "must be one of infra, before_workers"),
            id="t45-start",
        ),
        pytest.param(
            "- {name: r, command: [x, '']}",
            ("services[0].command", "command/args must not contain empty arguments"),
            id="t62",
        ),
    ],
)
def test_t42_to_t45_and_t62_messages(entry: str, expected: tuple[str, str]) -> None:
    [(path, message)] = problems(disagg(entry))
    assert path == expected[0] and message.startswith(expected[1]), (path, message)


def test_t49_a_phase_without_services_launches_nothing() -> None:
    phases = [s.phase for s in state(disagg("- {name: r, command: [x]}")).stages]
    assert "before_workers" not in phases and "infra" not in phases


def test_t50_generic_on_head_renders_per_node() -> None:
    [spec] = services(
        disagg(
            """\
            - name: router
              command: [router, "--host={node}", "--infra={infra_ip}"]
              env: {ROUTER_MODE: fast}
            """
        )
    )
    assert spec.name == "service_router" and spec.log == "logs/service_router.out"
    assert spec.argv == ("router", "--host=node1", "--infra=127.0.0.2")
    assert dict(spec.env) == {"ROUTER_MODE": "fast"}
    assert spec.preamble is None and spec.critical is False and spec.container is None


def test_t51_container_override_and_critical() -> None:
    [spec] = services(disagg("- {name: r, command: [x], container: 'img:1', critical: true}"))
    assert (spec.container, spec.critical) == ("img:1", True)


def test_t52_declaration_order_is_launch_order() -> None:
    text = disagg("- {name: b, command: [x]}\n- {name: a, command: [x]}\n- {name: c, command: [x]}")
    names = [s.name for s in state(text).stages if s.phase == "after_frontend"]
    assert names == ["after_frontend/b", "after_frontend/a", "after_frontend/c"]


def test_t53_readiness_of_the_recipe_is_the_probe() -> None:
    [spec] = services(
        disagg("- {name: r, command: [x], readiness: {port: 9000, timeout_seconds: 5}}")
    )
    assert spec.probe is not None
    assert (spec.probe.port, spec.probe.timeout_seconds) == (9000, 5)


MOONCAKE = """\
- name: mooncake-master
  type: mooncake-master
  container: "mooncake:1"
- name: store-prefill
  type: mooncake-store
  placement: {node: prefill}
  preamble: "echo starting-{role}-on-{node}"
  env:
    MOONCAKE_MASTER: "elsewhere:1"
    MOONCAKE_CONFIG: '{"protocol": "rdma", "device_name": ""}'
  cpus_per_task: 8
  cpu_bind: none
  srun_options: {exclusive: ""}
- name: store-decode
  type: mooncake-store
  placement: {node: decode}
"""


def test_t59_mooncake_master_then_one_store_per_role_node() -> None:
    specs = services(disagg(MOONCAKE))
    assert [(s.name, s.node) for s in specs] == [
        ("service_mooncake-master", "node1"),
        ("service_store-prefill", "node1"),
        ("service_store-decode_node2", "node2"),
        ("service_store-decode_node3", "node3"),
    ]
    assert all(s.critical for s in specs)
    assert all(s.stage.startswith("before_workers/") and s.shutdown_tier == 1 for s in specs)
    master, prefill, decode2, _ = specs
    assert master.argv == (
        "mooncake_master",
        "--port=8700",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_port=8701",
        "--eviction_high_watermark_ratio=0.9",
        "--default_kv_lease_ttl=10000",
        "--rpc_thread_num=16",
        "--enable_metric_reporting=true",
        "--metrics_port=8702",
    )
    assert master.probe is not None
    assert (master.probe.kind, master.probe.port, master.probe.more_ports) == (
        "tcp",
        8700,
        (8701, 8702),
    )
    assert master.probe.describe("10.0.0.9") == "tcp 10.0.0.9:8700,8701,8702"  # in turn
    assert prefill.argv == ("python", "-m", "mooncake.mooncake_store_service")
    assert prefill.probe is None  # the store has no default probe
    assert dict(prefill.env) == {
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.2",  # the node's own IP
        "MOONCAKE_MASTER": "127.0.0.2:8700",  # forced: the recipe's value is ignored
        "MOONCAKE_CONFIG": '{"protocol": "rdma", "device_name": ""}',  # JSON untouched
        "MOONCAKE_TE_META_DATA_SERVER": "http://127.0.0.2:8701/metadata",
    }
    assert dict(decode2.env)["MOONCAKE_LOCAL_HOSTNAME"] == "127.0.0.3"
    assert prefill.preamble == "echo starting-prefill-on-node1"
    assert (prefill.cpus_per_task, prefill.cpu_bind) == (8, "none")
    assert prefill.srun_options == (("exclusive", ""),)
    assert prefill.container == decode2.container == "mooncake:1"  # the master's image


def test_t59_a_recipe_can_pin_the_store_hostname() -> None:
    text = disagg(
        MOONCAKE.replace('MOONCAKE_MASTER: "elsewhere:1"', "MOONCAKE_LOCAL_HOSTNAME: nic0")
    )
    prefill = services(text)[1]
    assert dict(prefill.env)["MOONCAKE_LOCAL_HOSTNAME"] == "nic0"


def test_t48_mooncake_store_requires_a_master() -> None:
    assert problems(disagg("- {name: s, type: mooncake-store}")) == [
        (
            "services[0].type",
            "services[s] (type mooncake-store) requires a mooncake-master service, which "
            "launches the master the store registers with",
        )
    ]
    kind = get_kind("mooncake-store")
    assert kind is not None
    assert (kind.default_start, kind.default_critical) == ("before_workers", True)


def test_t60_two_services_on_one_port_on_one_node() -> None:
    found = problems(
        disagg(
            """\
            - {name: a, command: [x], placement: {node: prefill}, readiness: {port: 8800}}
            - {name: b, command: [x], placement: {node: head}, readiness: {port: 8800}}
            """
        )
    )
    assert found == [
        (
            "services[1].readiness",
            "services[a] and services[b] both listen on port 8800 on node node1; give them "
            "disjoint placements or ports",
        )
    ]


def test_t61_workers_placement_is_one_instance_per_worker_node() -> None:
    specs = services(disagg("- {name: lm, type: lmcache-server}"))
    assert [s.node for s in specs] == ["node1", "node2", "node3"]


def test_t47_lmcache_server_defaults() -> None:
    [spec, *_] = services(disagg("- {name: lmcache, type: lmcache-server}"))
    assert spec.argv == (
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
    )
    assert (spec.stage, spec.critical, spec.shutdown_tier) == ("before_workers/lmcache", True, 1)
    probe = spec.probe
    assert probe is not None
    assert (probe.kind, probe.port, probe.path, probe.status) == ("http", 8751, "/healthcheck", 200)
    assert probe.timeout_seconds == 300


def test_t77_lmcache_on_one_role_or_on_every_worker() -> None:
    # srtr has no vLLM connectors to imply it from: the recipe declares where it runs.
    only_prefill = services(
        disagg("- {name: lm, type: lmcache-server, placement: {node: prefill}}")
    )
    assert [s.node for s in only_prefill] == ["node1"]


def test_t78_a_disabled_lmcache_server_is_dropped() -> None:
    assert services(disagg("- {name: lm, type: lmcache-server, enabled: false}")) == []


def test_kind_options_outside_the_allow_list_are_refused() -> None:
    assert problems(disagg("- {name: lm, type: lmcache-server, options: {port: 1}}")) == [
        ("services[0].options", "has keys type 'lmcache-server' does not understand: port")
    ]


def test_only_one_mooncake_master() -> None:
    found = problems(
        disagg("- {name: m1, type: mooncake-master}\n- {name: m2, type: mooncake-master}")
    )
    assert ("services[1]", "only one mooncake-master service is supported") in found


# --- §11.7: the TensorRT-LLM pool master and the donors ------------------------------------------


def test_t120_trtllm_master_argv_env_and_srun() -> None:
    [spec] = services(
        disagg(
            """\
            - name: mooncake-master
              type: mooncake-master
              options: {store_role: both, master_timeout_s: 900}
              args: [--extra]
            """
        )
    )
    assert spec.argv == (
        "trtllm-serve",
        "mooncake_master",
        "--rpc_port",
        "8700",
        "--metrics_port",
        "8702",
        "--eviction_ratio",
        "0.05",
        "--address_file",
        "/logs/mooncake_master.addr",
        "--extra",
    )
    assert dict(spec.env) == {
        "TRTLLM_MOONCAKE_RUN_DIR": "/logs/mooncake/master",
        "TRTLLM_MOONCAKE_MASTER_TIMEOUT": "900",
    }
    assert spec.srun_options == (("mpi", "none"),)
    assert spec.preamble == f"mkdir -p /logs/mooncake/master && {SCRUB_MPI_ENV}"


@pytest.mark.parametrize(
    ("options", "path", "message"),
    [
        (
            "{store_role: both, master_timeout_s: 0}",
            "options.master_timeout_s",
            "must be a positive integer",
        ),
        (
            "{store_role: both, eviction_ratio: 1.5}",
            "options.eviction_ratio",
            "must be between 0 and 1",
        ),
        (
            "{store_role: leader}",
            "options.store_role",
            "must be one of both, producer, consumer; got 'leader'",
        ),
    ],
)
def test_t123_trtllm_master_option_checks(options: str, path: str, message: str) -> None:
    text = disagg(f"- {{name: m, type: mooncake-master, options: {options}}}")
    assert problems(text) == [(f"services[0].{path}", message)]


def test_t120_donor_argv_env_and_probe_per_node() -> None:
    kind = get_kind("mooncake-donor")
    assert kind is not None and kind.default_command is not None
    assert kind.default_command({"size": "640GiB"}) == [
        "python3",
        "/srtctl-runtime/donor_diagnostics.py",
        "trtllm-serve",
        "mooncake_donor",
        "--master_server_address",
        "file:///logs/mooncake_master.addr",
        "--segment_size",
        "640GiB",
        "--protocol",
        "rdma",
        "--ready_file",
        "/logs/mooncake/donor-{node}.ready",
    ]
    assert kind.default_readiness is not None
    probe = kind.default_readiness({})
    assert probe.file is not None and probe.file.path == "mooncake/donor-{node}.ready"
    assert (kind.default_start, kind.default_critical, kind.default_placement) == (
        "with_workers",
        True,
        "decode",
    )
    assert kind.default_srun_options is not None
    assert kind.default_srun_options({}) == {"mpi": "none"}


DONOR = """\
- name: mooncake-master
  type: mooncake-master
  options: {store_role: both, master_timeout_s: 900}
- name: donor
  type: mooncake-donor
  options: {size: 640GiB}
"""


def test_t123_donor_config_errors() -> None:
    found = problems(disagg("- {name: donor, type: mooncake-donor, placement: {node: prefill}}"))
    messages = {m for _, m in found}
    assert (
        "mooncake-donor requires a TRT-LLM mooncake-master service "
        "(a mooncake-master with options.store_role)" in messages
    )
    assert "mooncake-donor requires options.size (for example 640GiB)" in messages
    assert "mooncake-donor requires placement.node: decode" in messages


def test_t120_donor_launches_with_the_workers_and_is_probed_after_them() -> None:
    """The donor joins while workers start (srtctl's [WW] lineage, `start: with_workers`):
    one donor per decode node, in the workers stage, with a per-node ready-file probe that
    waits for every worker's launch."""
    donors = [s for s in services(disagg(DONOR)) if s.service == "donor"]
    assert {(s.stage, s.deferred_probe) for s in donors} == {("workers", True)}
    assert [(s.name, s.node) for s in donors] == [
        ("service_donor_node2", "node2"),
        ("service_donor_node3", "node3"),
    ]
    assert donors[0].probe is not None and donors[0].probe.path == "mooncake/donor-node2.ready"
    assert dict(donors[0].env)["TRTLLM_MOONCAKE_MASTER_TIMEOUT"] == "900"


# --- gms ----------------------------------------------------------------------------------------

AGG = """\
name: gms
resources: {gpus_per_node: 8}
roles:
  agg: {nodes: 1, workers: 2, gpus: 4, command: [sleep, inf]}
services:
"""


def test_gms_defaults_one_per_worker_in_its_device_view() -> None:
    specs = services(AGG + "  - {name: gms, type: gms}\n")
    assert [s.name for s in specs] == ["service_gms_agg_0_node1", "service_gms_agg_1_node1"]
    assert [dict(s.env) for s in specs] == [
        {"GMS_SOCKET_DIR": "/tmp/srtr-gms/gms/agg-0-0", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"GMS_SOCKET_DIR": "/tmp/srtr-gms/gms/agg-1-0", "CUDA_VISIBLE_DEVICES": "4,5,6,7"},
    ]
    spec = specs[0]
    assert spec.argv[:2] == ("bash", "-c")
    assert "devices=4\n" in spec.argv[2]  # one GMS server per GPU of the worker
    assert 'python3 -m gpu_memory_service --device "$device" &' in spec.argv[2]
    assert (spec.critical, spec.shutdown_tier, spec.stage) == (True, 1, "before_workers/gms")
    probe = spec.probe
    assert probe is not None and probe.kind == "log"
    assert probe.pattern == re.escape("GMS ready:")
    assert (probe.timeout_seconds, probe.interval_seconds) == (150, 1)


def test_gms_needs_per_worker() -> None:
    text = AGG + "  - {name: gms, type: gms, placement: {node: agg}}\n"
    assert problems(text) == [
        (
            "services[0].placement.per",
            "services[gms] (type gms) runs one instance per worker in that worker's device "
            "view; set placement.per: worker",
        )
    ]


def test_gms_socket_dir_is_forced() -> None:
    specs = services(AGG + "  - {name: gms, type: gms, env: {GMS_SOCKET_DIR: /x}}\n")
    assert dict(specs[0].env)["GMS_SOCKET_DIR"] == "/tmp/srtr-gms/gms/agg-0-0"


# --- §11.5: placement.per: worker ---------------------------------------------------------------

WATCH = """\
name: pw
resources: {gpus_per_node: 2}
roles:
  agg: {nodes: 1, workers: 2, gpus: 1, command: [sleep, inf]}
services:
  - name: gpu-watch
    command: [watch, "--role={worker_role}", "--gpus={worker_gpus}", "--log={node}"]
    env: {WATCH_GPUS: "{worker_gpu_count}"}
    start: before_workers
    placement: {node: agg, per: worker}
    readiness: {log: {pattern: watching}}
"""


def test_t90_per_defaults_to_node_and_accepts_worker() -> None:
    specs = services(disagg("- {name: n, command: [x], placement: {node: decode}}"))
    assert [s.name for s in specs] == ["service_n_node2", "service_n_node3"]
    assert "per=worker" in plan_text(*plan(WATCH))
    assert "per=worker" not in plan_text(*plan(disagg("- {name: n, command: [x]}")))


@pytest.mark.parametrize(
    ("placement", "path", "message"),
    [
        (
            "{node: head, per: worker}",
            "placement.per",
            "worker needs placement.node in prefill, decode, agg, workers; got 'head'",
        ),
        (
            "{node: all, per: worker}",
            "placement.per",
            "worker needs placement.node in prefill, decode, agg, workers; got 'all'",
        ),
        (
            "{per: worker}",
            "placement.per",
            "worker needs placement.node in prefill, decode, agg, workers; got 'head'",
        ),
        (
            "{pool: train, per: worker}",
            "placement.per",
            "worker attaches to engine workers, not to a pool",
        ),
        ("{node: agg, per: rank}", "placement.per", "must be one of node, worker; got 'rank'"),
    ],
)
def test_t91_per_worker_placement_errors(placement: str, path: str, message: str) -> None:
    text = (
        "name: t\nroles:\n  agg: {nodes: 1, command: [x]}\nservices:\n"
        "  - {name: train, command: [x], nodes: 1}\n"
        f"  - {{name: w, command: [x], placement: {placement}}}\n"
    )
    assert problems(text) == [(f"services[1].{path}", message)]


def test_t92_per_worker_cannot_own_a_pool_and_needs_a_log_probe() -> None:
    base = "name: t\nroles:\n  agg: {nodes: 1, command: [x]}\nservices:\n"
    owner = (
        base + "  - {name: w, command: [x], nodes: 1, placement: {node: workers, per: worker}}\n"
    )
    assert problems(owner) == [
        ("services[0].placement.per", "worker attaches to engine workers; it cannot own a pool")
    ]
    tcp = (
        base
        + "  - {name: w, command: [x], placement: {node: agg, per: worker}, readiness: {port: 9}}\n"
    )
    assert problems(tcp) == [
        (
            "services[0].readiness",
            "placement.per: worker instances share their node's ports, so readiness must be a "
            "log probe",
        )
    ]
    log = (
        base
        + "  - {name: w, command: [x], placement: {node: agg, per: worker},\n"
        + "     readiness: {log: {pattern: up}}}\n"
    )
    assert len(services(log)) == 1


def test_t93_worker_placeholders() -> None:
    text = (
        "name: t\nresources: {gpus_per_node: 8}\nroles:\n"
        "  decode: {nodes: 2, workers: 6, gpus: 2, command: [x]}\nservices:\n"
        "  - name: w\n    placement: {node: decode, per: worker}\n"
        '    command: [w, "{worker_role}", "{worker_index}", "{worker_node_rank}", '
        '"{worker_gpus}", "{worker_gpu_count}", "{index}", "{node}"]\n'
        "  - {name: plain, command: [p, '{worker_role}'], placement: {node: decode}}\n"
    )
    specs = services(text)
    by_name = {s.name: s for s in specs}
    # Workers 0..2 on node1, 3..5 on node2; worker 4 is the second on node2: GPUs 2,3.
    assert by_name["service_w_decode_4_node2"].argv == (
        "w",
        "decode",
        "4",
        "0",
        "2,3",
        "2",
        "4",
        "node2",
    )
    assert [s.name for s in specs if s.service == "w"] == [
        f"service_w_decode_{k}_node{1 + k // 3}" for k in range(6)
    ]
    # Outside per: worker the keys do not exist and stay as written.
    assert by_name["service_plain_node1"].argv == ("p", "{worker_role}")


def test_t94_two_one_gpu_agg_workers() -> None:
    specs = services(WATCH)
    assert [s.name for s in specs] == [
        "service_gpu-watch_agg_0_node1",
        "service_gpu-watch_agg_1_node1",
    ]
    assert [s.argv for s in specs] == [
        ("watch", "--role=agg", "--gpus=0", "--log=node1"),
        ("watch", "--role=agg", "--gpus=1", "--log=node1"),
    ]
    assert [dict(s.env) for s in specs] == [
        {"WATCH_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"},
        {"WATCH_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"},
    ]
    assert specs[0].log == "logs/service_gpu-watch_agg_0_node1.out"
    assert {s.shutdown_tier for s in specs} == {1}  # before_workers


def test_t95_a_full_node_worker_is_not_pinned() -> None:
    text = WATCH.replace("workers: 2, gpus: 1", "workers: 1, gpus: 2")
    [spec] = services(text)
    assert "CUDA_VISIBLE_DEVICES" not in dict(spec.env)
    assert spec.argv[2] == "--gpus=0,1"


def test_t95_the_worker_view_wins_over_the_recipe_env() -> None:
    text = WATCH.replace(
        'env: {WATCH_GPUS: "{worker_gpu_count}"}', "env: {CUDA_VISIBLE_DEVICES: '7'}"
    )
    assert [dict(s.env)["CUDA_VISIBLE_DEVICES"] for s in services(text)] == ["0", "1"]


def test_t96_per_node_services_are_unchanged() -> None:
    specs = services(disagg("- {name: n, command: [x], placement: {node: prefill}}"))
    assert [s.name for s in specs] == ["service_n"]


def test_per_worker_on_workers_spans_every_role_in_node_order() -> None:
    text = disagg(
        "- {name: w, command: [x], placement: {node: workers, per: worker}, "
        "readiness: {log: {pattern: up}}}"
    )
    assert [s.name for s in services(text)] == [
        "service_w_prefill_0_node1",
        "service_w_decode_0_node2",
        "service_w_decode_1_node3",
    ]


# --- a missing program is an event, not a crash -------------------------------------------------

GPU_KINDS = """\
name: gpu
resources: {gpus_per_node: 2}
roles:
  agg: {nodes: 1, workers: 2, gpus: 1, command: [sleep, inf]}
services:
  - {name: mooncake-master, type: mooncake-master}
  - {name: gms, type: gms}
  - {name: lm, type: lmcache-server}
"""


def test_kinds_without_their_program_are_skipped_with_one_event_each(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GPU_KINDS, tmp_path)
        h.backend.missing_programs = {"mooncake_master", "lmcache", "gpu_memory_service"}
        exporter.start(h.ctx)
        await h.settle()
        looked = [name for what, name in h.backend.looked if what == "binary"]
        assert looked == ["mooncake_master", "lmcache"]
        missing = [e.message for e in h.events if e.reason == "ProgramMissing"]
        assert missing == [
            "mooncake-master: binary 'mooncake_master' not found on PATH; skipping its 1 "
            "instance(s)",
            "gms: Python module 'gpu_memory_service' not found; skipping its 2 instance(s)",
            "lmcache-server: binary 'lmcache' not found on PATH; skipping its 1 instance(s)",
        ]
        for name in ("service_mooncake-master", "service_gms_agg_0_node1", "service_lm"):
            assert h.phase(name) == "Succeeded" and h.backend.launched(name) == 0
        assert h.phase("worker_agg_0") == "Running"  # the job goes on

    asyncio.run(body())
