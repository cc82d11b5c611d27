"""The discovery plane and the process exporter, at plan level: srtctl's expectations.

Ports of the reference's T-63..T-69, T-71, T-74..T-76, T-16 (terminal external) and T-85, plus
the rules V-24..V-27, V-46, V-48 and the env layering S-18/S-53. Where srtr differs on purpose the
test says so: Debian binaries instead of `/configs/...`, per-node data dirs in the run dir instead
of `/tmp/etcd`, listeners on the node's IP, and no Dynamo frontend, so nothing implies etcd/nats
(T-63/T-64 become "declared etcd/nats", "no etcd/nats: no discovery env").
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from srtr.cli import main
from srtr.resources.effective import allocation_size, effective_services
from srtr.resources.errors import RecipeError, format_path
from srtr.resources.expand import local_allocation
from srtr.resources.kinds import KINDS
from srtr.resources.kinds.exporters import PROCESS_EXPORTER_GROUPS
from srtr.resources.loading import load_text
from srtr.resources.objects import DesiredState, InstanceSpec, ProbeKind
from srtr.resources.planning import plan_text_source
from srtr.runtime.targets_file import TargetsFile

Found = tuple[int, str, str]


def plan(text: str, nodes: int | None = None) -> DesiredState:
    allocation = local_allocation(nodes) if nodes else None
    return plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)[1]


def problems(text: str, nodes: int | None = None) -> list[Found]:
    allocation = local_allocation(nodes) if nodes else None
    with pytest.raises(RecipeError) as info:
        plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)
    return [(p.line, format_path(p.path), p.message) for p in info.value.problems]


def env(spec: InstanceSpec) -> dict[str, str]:
    return dict(spec.env)


PLANE = """\
name: disc
roles:
  agg: {nodes: 1, command: [sleep, inf]}
services:
  - name: etcd
    type: etcd
  - name: nats
    type: nats
  - name: router
    command: [sleep, inf]
    env: {MINE: "1"}
  - name: train
    command: [sleep, inf]
    nodes: 2
benchmark:
  type: custom
  command: "true"
"""


# --- T-63: etcd and nats on the infra node ----------------------------------------------------


def test_t63_declared_etcd_and_nats_launch_first_on_the_infra_node() -> None:
    state = plan(PLANE, nodes=3)
    etcd, nats = state.instance("service_etcd"), state.instance("service_nats")
    assert (etcd.node, nats.node) == (state.nodes.infra, state.nodes.infra) == ("node1",) * 2
    assert etcd.critical and nats.critical
    assert [s.name for s in state.stages[:2]] == ["infra/etcd", "infra/nats"]
    # srtctl's argv shape with Debian's binary, the node's IP and a per-node data dir.
    assert etcd.argv == (
        "etcd",
        "--data-dir",
        "data/etcd-node1",
        "--listen-client-urls",
        "http://127.0.0.2:2379",
        "--advertise-client-urls",
        "http://127.0.0.2:2379",
        "--listen-peer-urls",
        "http://127.0.0.2:2380",
    )
    assert etcd.preamble == (
        'cd "$SRTR_RUN_DIR" && rm -rf data/etcd-node1 && mkdir -p data/etcd-node1'
    )
    assert nats.argv == (
        "nats-server",
        "-js",
        "-sd",
        "data/nats-node1",
        "-a",
        "127.0.0.2",
        "-p",
        "4222",
    )
    assert nats.preamble is not None and "rm -rf data/nats-node1" in nats.preamble
    for spec, port in ((etcd, 2379), (nats, 4222)):
        assert spec.probe is not None
        assert (spec.probe.kind, spec.probe.port, spec.probe.timeout_seconds) == (
            ProbeKind.TCP,
            port,
            300.0,
        )
        # The discovery plane never receives discovery env (S-38, S-39).
        assert "ETCD_ENDPOINTS" not in env(spec) and "NATS_SERVER" not in env(spec)


def test_s53_services_workers_and_the_benchmark_get_the_discovery_env() -> None:
    state = plan(PLANE, nodes=3)
    want = {"ETCD_ENDPOINTS": "http://127.0.0.2:2379", "NATS_SERVER": "nats://127.0.0.2:4222"}
    for name in (
        "service_router",
        "service_train_node2",
        "service_train_node3",
        "worker_agg_0",
        "benchmark",
    ):
        got = env(state.instance(name))
        assert {k: got.get(k) for k in want} == want, name
    assert env(state.instance("service_router"))["MINE"] == "1"
    assert dict(state.discovery_env) == want


def test_s53_a_recipe_value_wins_over_the_discovery_env() -> None:
    text = PLANE.replace('env: {MINE: "1"}', 'env: {ETCD_ENDPOINTS: "http://elsewhere:1"}')
    state = plan(text, nodes=3)
    assert env(state.instance("service_router"))["ETCD_ENDPOINTS"] == "http://elsewhere:1"
    assert env(state.instance("service_train_node2"))["ETCD_ENDPOINTS"] == ("http://127.0.0.2:2379")


def test_s18_inherit_discovery_env_false_opts_a_service_out() -> None:
    text = PLANE.replace('env: {MINE: "1"}', "inherit_discovery_env: false")
    state = plan(text, nodes=3)
    assert "ETCD_ENDPOINTS" not in env(state.instance("service_router"))
    assert "NATS_SERVER" not in env(state.instance("service_router"))
    assert "ETCD_ENDPOINTS" in env(state.instance("service_train_node2"))


def test_t64_no_etcd_or_nats_means_no_discovery_env() -> None:
    # srtr differs: srtctl always sets ETCD_ENDPOINTS (its Dynamo frontend implies etcd);
    # srtr has no such frontend, so without a declared etcd nothing points at one.
    text = PLANE.replace("  - name: etcd\n    type: etcd\n  - name: nats\n    type: nats\n", "")
    state = plan(text, nodes=3)
    assert not [s for s in state.instances if s.type in ("etcd", "nats")]
    for spec in state.instances:
        assert not {"ETCD_ENDPOINTS", "NATS_SERVER"} & set(env(spec)), spec.name
    assert state.discovery_env == ()
    assert not [s for s, why in effective_services(load_text(textwrap.dedent(text))) if why]


# --- T-65, T-66, T-85: external and disabled ---------------------------------------------------


def test_t65_an_external_etcd_is_not_launched_and_its_address_is_injected() -> None:
    text = PLANE.replace("    type: etcd\n", "    type: etcd\n    external: http://10.9.9.9:2379\n")
    text = text.replace("    type: nats\n", "    type: nats\n    enabled: false\n")
    state = plan(text, nodes=3)
    assert not [s for s in state.instances if s.service in ("etcd", "nats")]
    assert dict(state.discovery_env) == {"ETCD_ENDPOINTS": "http://10.9.9.9:2379"}
    assert env(state.instance("service_router"))["ETCD_ENDPOINTS"] == "http://10.9.9.9:2379"
    assert "NATS_SERVER" not in env(state.instance("benchmark"))
    assert not [w for w in state.warnings if "etcd" in w]  # launching nothing is the point


def test_t66_a_disabled_nats_leaves_only_etcd() -> None:
    state = plan(PLANE.replace("    type: nats\n", "    type: nats\n    enabled: false\n"), 3)
    assert [s.name for s in state.instances if s.stage.startswith("infra/")] == ["service_etcd"]
    assert dict(state.discovery_env) == {"ETCD_ENDPOINTS": "http://127.0.0.2:2379"}


def test_t85_external_and_disabled_services_are_not_scraped() -> None:
    state = plan(
        """\
        name: t
        services:
          - name: etcd
            type: etcd
            external: http://10.9.9.9:2379
            metrics: {port: 2379}
          - name: nats
            type: nats
            enabled: false
            metrics: {port: 8222}
          - name: app
            command: [sleep, inf]
            metrics: {port: 9000}
        """
    )
    assert [e.service for e in state.exporters] == ["app"]


# --- T-67, T-68, T-69: nats options and dedicated ------------------------------------------------


def test_t67_nats_max_payload_writes_a_config_file() -> None:
    text = PLANE.replace("    type: nats\n", "    type: nats\n    options: {max_payload_mb: 24}\n")
    nats = plan(text, nodes=3).instance("service_nats")
    assert nats.argv[:3] == ("nats-server", "-c", "data/nats-node1.conf")
    assert nats.preamble is not None
    assert "max_payload: 25165824" in nats.preamble
    assert "> data/nats-node1.conf" in nats.preamble
    assert 'store_dir: "data/nats-node1"' in nats.preamble


def test_t68_dedicated_etcd_and_nats_reserve_the_infra_node_and_keep_their_options() -> None:
    text = PLANE.replace(
        "    type: etcd\n",
        "    type: etcd\n    placement: {node: dedicated}\n    options: {port: 2400}\n",
    ).replace("    type: nats\n", "    type: nats\n    placement: {node: dedicated}\n")
    recipe = load_text(textwrap.dedent(text))
    assert allocation_size(recipe) == allocation_size(load_text(textwrap.dedent(PLANE))) + 1
    state = plan(text, nodes=4)
    assert state.nodes.infra == "node1" and state.nodes.reserved == ("node1",)
    assert state.nodes.head == "node2"  # the first compute node, as srtctl (S-83)
    etcd = state.instance("service_etcd")
    assert etcd.node == "node1" and "http://127.0.0.2:2400" in etcd.argv
    assert etcd.probe is not None and etcd.probe.port == 2400
    assert {s.type for s in state.instances if s.node == "node1"} == {"etcd", "nats"}
    assert dict(state.discovery_env)["ETCD_ENDPOINTS"] == "http://127.0.0.2:2400"


def test_t69_etcd_and_nats_must_agree_on_dedicated() -> None:
    text = PLANE.replace("    type: etcd\n", "    type: etcd\n    placement: {node: dedicated}\n")
    assert problems(text) == [
        (
            8,
            "services[1].placement.node",
            "services etcd and nats must agree on placement.node: dedicated (they share the "
            "infra node)",
        )
    ]


# --- rules: V-24..V-27, V-46, S-38 placement ------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        pytest.param(
            "type: etcd\n    external: ' '",
            (5, "services[0].external", "must be a non-empty endpoint"),
            id="v26-blank-external",
        ),
        pytest.param(
            "command: [a]\n    external: http://x:1",
            (
                5,
                "services[0].external",
                "is only valid for discovery-plane kinds, not 'generic'",
            ),
            id="v26-external-on-generic",
        ),
        pytest.param(
            "type: etcd\n    external: http://x:1\n    terminal: true",
            (
                6,
                "services[0].terminal",
                "needs a process to wait for; an external service launches nothing",
            ),
            id="t16-terminal-external",
        ),
        pytest.param(
            "type: nats\n    placement: {node: workers}",
            (
                5,
                "services[0].placement.node",
                "(type nats) must be placed on head, infra, or dedicated; got 'workers'. "
                "The discovery plane lives on the infra node.",
            ),
            id="s39-placement",
        ),
        pytest.param(
            "type: nats\n    options: {max_payload_mb: 0}",
            (
                5,
                "services[0].options",
                "options.max_payload_mb must be a positive integer; got 0",
            ),
            id="s39-max-payload-positive",
        ),
        pytest.param(
            "type: etcd\n    options: {port: 70000}",
            (5, "services[0].options", "options.port must be between 1 and 65535; got 70000"),
            id="etcd-port-range",
        ),
        pytest.param(
            "type: etcd\n    start: later",
            (
                5,
                "services[0].start",
                "must be one of infra, before_workers, with_workers, after_frontend; got 'later'",
            ),
            id="v24-bad-start",
        ),
    ],
)
def test_discovery_rules(service: str, expected: Found) -> None:
    assert problems(f"name: t\nservices:\n  - name: s\n    {service}\n") == [expected]


def test_s38_etcd_cannot_own_a_pool() -> None:
    found = problems("name: t\nservices:\n  - name: s\n    type: etcd\n    nodes: 2\n")
    # Line 3: there is no placement block, so the service's own line.
    assert found == [
        (
            3,
            "services[0].placement.node",
            "(type etcd) must be placed on head, infra, or dedicated; got 'workers'. "
            "The discovery plane lives on the infra node.",
        )
    ]


def test_v27_dedicated_names_the_kinds_that_support_it() -> None:
    found = problems(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    placement:\n      node: dedicated\n"
    )
    assert found == [
        (
            6,
            "services[0].placement.node",
            "dedicated is only supported for infra-class kinds (etcd, nats); use head, infra, "
            "or workers for type 'generic'",
        )
    ]


def test_only_one_etcd_per_job() -> None:
    text = "name: t\nservices:\n  - name: a\n    type: etcd\n  - name: b\n    type: etcd\n"
    assert problems(text) == [
        (6, "services[1].type", "only one etcd service is supported (services[a] is one)")
    ]


# --- T-71, T-74, T-76: the process exporter ------------------------------------------------------


EXPO = """\
name: t
services:
  - name: train
    command: [sleep, inf]
    nodes: 2
observability:
  exporters: true
"""


def test_t71_implied_exporters_are_dcgm_node_then_process() -> None:
    services = effective_services(load_text(EXPO))
    assert [(s.name, why) for s, why in services][:3] == [
        ("dcgm-exporter", "observability.exporters"),
        ("node-exporter", "observability.exporters"),
        ("process-exporter", "observability.exporters"),
    ]


def test_t74_process_exporter_runs_on_all_nodes_with_srtctls_flags() -> None:
    state = plan(EXPO, nodes=3)
    procs = [s for s in state.instances if s.service == "process-exporter"]
    assert [s.node for s in procs] == ["node1", "node2"]  # `all`: head is the pool's first
    spec = procs[1]
    assert spec.argv == (
        "prometheus-process-exporter",
        "-config.path",
        "process-exporter.yml",
        "-web.listen-address=127.0.0.3:9256",
        "-threads=true",
        "-children=false",
        "-recheck=false",
    )
    assert spec.preamble == 'cd "$SRTR_RUN_DIR"'  # the group file is in the run dir
    assert not spec.critical and spec.container is None
    names = [e.name for e in state.exporters if e.service == "process-exporter"]
    assert names == ["process_exporter_node1", "process_exporter_node2"]


def test_t76_process_exporter_options_binary_and_port() -> None:
    state = plan(
        """\
        name: t
        services:
          - name: procs
            type: process-exporter
            options: {binary: /opt/pe/process-exporter, port: 9300}
        """
    )
    spec = state.instance("service_procs")
    assert spec.argv[0] == "/opt/pe/process-exporter"
    assert "-web.listen-address=127.0.0.2:9300" in spec.argv
    assert [e.url for e in state.exporters] == ["http://127.0.0.2:9300/metrics"]


def test_the_group_file_is_written_to_the_run_dir_before_launch(tmp_path: Path) -> None:
    from tests.support.controller_harness import Harness

    h = Harness(EXPO, tmp_path, 2)
    TargetsFile(h.ctx).attach()  # before the first launch, as the runner starts it
    written = tmp_path / "process-exporter.yml"
    assert written.read_text() == PROCESS_EXPORTER_GROUPS
    assert "process_names" in written.read_text()


def test_registered_kinds_include_the_discovery_plane() -> None:
    assert {"etcd", "nats", "process-exporter"} <= set(KINDS)
    assert KINDS["etcd"].supports_external and KINDS["nats"].supports_dedicated
    assert not KINDS["generic"].supports_dedicated


def test_plan_shows_the_discovery_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(PLANE)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Discovery env:\n  ETCD_ENDPOINTS=http://127.0.0.2:2379\n" in out
    assert "  NATS_SERVER=nats://127.0.0.2:4222\n" in out
