"""Exporters without processes: T-80..T-88 adapted to srtr, the exporter controller, metrics.

The reference's tachometer targets become srtr's `ExporterSpec`s and a Prometheus file_sd
file (`prometheus/targets.json`). Endpoint names are srtctl's (S-110):
`<metrics.name or kind prefix or service name>_<node>`, so `dcgm_node1` and
`node_exporter_node1`. Where srtr differs on purpose the test says so: URLs carry the node's
IP (every simulated node has its own loopback address), and there is no power telemetry
(T-86 becomes "a declared service replaces the implied one").
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from srtr.cli import main
from srtr.controllers import edits, exporter, intents
from srtr.resources.diff import diff
from srtr.resources.effective import effective_metrics, effective_services
from srtr.resources.errors import RecipeError, format_path
from srtr.resources.expand import expand, local_allocation
from srtr.resources.kinds import get_kind
from srtr.resources.loading import load_text
from srtr.resources.objects import ExporterSpec
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Metrics, Service
from srtr.runtime import metrics
from srtr.runtime.targets_file import TargetsFile
from srtr.store.persist import snapshot
from tests.support.controller_harness import Harness


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def problems(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(RecipeError) as info:
        plan_text_source(textwrap.dedent(text), "recipe.yaml")
    return [(p.line, format_path(p.path), p.message) for p in info.value.problems]


def exporters(text: str, nodes: int | None = None) -> list[ExporterSpec]:
    allocation = local_allocation(nodes) if nodes else None
    _, state = plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)
    return list(state.exporters)


# --- T-80: the metrics field --------------------------------------------------------------------


def test_t80_metrics_defaults() -> None:
    m = Metrics(port=9000)
    assert (m.path, m.nodes, m.name) == ("/metrics", "all", None)


@pytest.mark.parametrize(
    ("field", "value", "path", "message"),
    [
        ("port", "0", "services[0].metrics[0].port", "must be between 1 and 65535; got 0"),
        ("port", "70000", "services[0].metrics[0].port", "must be between 1 and 65535; got 70000"),
        ("path", "metrics", "services[0].metrics[0].path", "must start with '/'"),
        ("nodes", "some", "services[0].metrics[0].nodes", "must be all or first; got 'some'"),
        ("name", '" "', "services[0].metrics[0].name", "must not be empty"),
    ],
)
def test_t80_metrics_validation_messages(field: str, value: str, path: str, message: str) -> None:
    port = value if field == "port" else "9000"
    extra = f"      {field}: {value}\n" if field != "port" else ""
    text = "name: t\nservices:\n  - name: s\n    command: [a]\n    metrics:\n"
    found = problems(text + f"      port: {port}\n" + extra)
    assert [(p, m) for _, p, m in found] == [(path, message)]


def test_t80_several_endpoints_need_distinct_names() -> None:
    found = problems("""\
        name: t
        services:
          - name: s
            command: [a]
            metrics:
              - {port: 9000, name: a}
              - {port: 9001}
        """)
    assert found == [
        (
            5,
            "services[0].metrics",
            "declares 2 endpoints; give each a distinct name (it becomes the endpoint's name "
            "in the targets file)",
        )
    ]


# --- T-81: kinds --------------------------------------------------------------------------------


def test_t81_kind_annotations() -> None:
    def ports(type_: str, options: dict[str, Any] | None = None) -> list[int]:
        service = Service(name="s", type=type_, command=None, options=options or {})
        return [m.port for m in effective_metrics(service)]

    assert ports("node-exporter") == [9101]
    assert ports("node-exporter", {"port": 9500}) == [9500]
    assert ports("dcgm-exporter") == [9401]
    assert ports("dcgm-exporter", {"port": 9500}) == [9500]
    assert effective_metrics(Service(name="s", command=["a"])) == []  # generic: none
    node, dcgm = get_kind("node-exporter"), get_kind("dcgm-exporter")
    assert node is not None and dcgm is not None
    assert node.binary == "prometheus-node-exporter" and dcgm.binary == "dcgm-exporter"
    assert node.default_command is not None and dcgm.default_command is not None
    # Every address where nodes are separate hosts, the node's IP where they share one
    # kernel (test_kinds_listen_on_every_address_only_where_nodes_are_separate_hosts).
    assert "--web.listen-address={listen_host}:9101" in node.default_command({})
    assert "{listen_host}:9401" in dcgm.default_command({})
    assert (dcgm.metrics_prefix, node.metrics_prefix) == ("dcgm", "node_exporter")
    generic = get_kind("generic")
    assert generic is not None and generic.binary is None and generic.metrics_prefix is None


LISTENERS = """\
name: t
services:
  - {name: train, command: [sleep, inf], nodes: 1}
  - {name: node, type: node-exporter, placement: {pool: train}}
  - {name: dcgm, type: dcgm-exporter, placement: {pool: train}}
  - {name: procs, type: process-exporter}
  - {name: etcd, type: etcd}
  - {name: nats, type: nats}
  - name: ray
    type: ray
    nodes: 1
"""


def test_kinds_listen_on_every_address_only_where_nodes_are_separate_hosts() -> None:
    """As srtctl's (`dcgm-exporter --address :9401`) on nodes of their own; on the node's IP
    where nodes share one network stack (loopback addresses: the local backend), where a
    wildcard bind would take the port on every node at once (issue 22 part 7)."""

    def argvs(allocation: list[tuple[str, str]]) -> dict[str, str]:
        """Each service's first instance: its argv with its node's IP written as IP."""
        state = expand(load_text(LISTENERS), allocation)
        found: dict[str, str] = {}
        for i in state.instances:
            found.setdefault(i.service, " ".join(i.argv).replace(i.node_ip, "IP"))
        return found

    hosts = argvs([("node1", "10.77.42.11"), ("node2", "10.77.42.12")])
    assert "--web.listen-address=:9101" in hosts["node"]
    assert "--address :9401" in hosts["dcgm"]
    assert "-web.listen-address=:9256" in hosts["procs"]
    assert "--listen-client-urls http://0.0.0.0:2379" in hosts["etcd"]
    assert "--advertise-client-urls http://IP:2379" in hosts["etcd"]
    assert "-a 0.0.0.0" in hosts["nats"]
    assert "--dashboard-host=0.0.0.0" in hosts["ray"]
    assert "--node-ip-address=IP" in hosts["ray"]
    assert argvs([("node1", "node1"), ("node2", "node2")])["dcgm"] == hosts["dcgm"]

    shared = argvs(local_allocation(2))
    assert "--web.listen-address=IP:9101" in shared["node"]
    assert "--address IP:9401" in shared["dcgm"]
    assert "-web.listen-address=IP:9256" in shared["procs"]
    assert "--listen-client-urls http://IP:2379" in shared["etcd"]
    assert "-a IP" in shared["nats"]
    assert "--dashboard-host=IP" in shared["ray"]


# --- T-82..T-85: targets ------------------------------------------------------------------------

POOLS = """\
name: t
services:
  - name: engines
    command: [sleep, inf]
    nodes: 2
    metrics: {port: 9402}
  - name: miles
    command: [sleep, inf]
    nodes: 1
  - name: quiet
    command: [sleep, inf]
    placement: {pool: engines}
observability:
  exporters: true
"""


def test_t82_one_target_per_node_per_annotated_service() -> None:
    found = exporters(POOLS)
    rows = sorted((e.name, e.url, e.instance) for e in found)
    assert rows == sorted(
        [
            ("engines_node1", "http://127.0.0.2:9402/metrics", "service_engines_node1"),
            ("engines_node2", "http://127.0.0.3:9402/metrics", "service_engines_node2"),
        ]
        + [
            (
                f"{prefix}_node{k}",
                f"http://127.0.0.{k + 1}:{port}/metrics",
                f"service_{name}_node{k}",
            )
            for name, prefix, port in (
                ("dcgm-exporter", "dcgm", 9401),
                ("node-exporter", "node_exporter", 9101),
                # placed on `all`: here the head is a compute node, so the same three
                ("process-exporter", "process_exporter", 9256),
            )
            for k in (1, 2, 3)  # implied on compute: both pools' nodes
        ]
    )
    # No targets for services without metrics (miles, the quiet rider).
    assert {e.service for e in found} == {
        "engines",
        "node-exporter",
        "dcgm-exporter",
        "process-exporter",
    }


def test_s110_endpoint_names_take_the_kinds_prefix_unless_the_endpoint_is_named() -> None:
    found = exporters("""\
        name: t
        services:
          - name: gpus                   # any name: the kind's prefix names the endpoint
            type: dcgm-exporter
            nodes: 2
          - name: hosts
            type: node-exporter
            placement: {pool: gpus}
            metrics: {port: 9102, name: host}   # a named endpoint keeps its name
        """)
    assert [(e.service, e.name) for e in found] == [
        ("gpus", "dcgm_node1"),
        ("gpus", "dcgm_node2"),
        ("hosts", "host_node1"),
        ("hosts", "host_node2"),
    ]


def test_s111_implied_exporters_cover_pool_nodes_and_spares_are_left_out() -> None:
    found = exporters(POOLS, nodes=5)
    assert sorted(e.node for e in found if e.service == "node-exporter") == [
        "node1",
        "node2",
        "node3",
    ]


def test_t83_nodes_first_scrapes_only_the_first_node() -> None:
    found = exporters("""\
        name: t
        services:
          - name: train
            command: [sleep, inf]
            nodes: 3
            metrics: {port: 9090, nodes: first}
        """)
    assert [(e.name, e.url) for e in found] == [("train_node1", "http://127.0.0.2:9090/metrics")]


def test_t84_several_named_endpoints() -> None:
    found = exporters("""\
        name: t
        services:
          - name: train
            command: [sleep, inf]
            nodes: 2
            metrics:
              - {port: 9090, name: miles, nodes: first}
              - {port: 31000, path: /engine_metrics, name: engines, nodes: first}
        """)
    assert [(e.name, e.url) for e in found] == [
        ("miles_node1", "http://127.0.0.2:9090/metrics"),
        ("engines_node1", "http://127.0.0.2:31000/engine_metrics"),
    ]


def test_t85_disabled_services_are_not_scraped() -> None:
    found = exporters("""\
        name: t
        services:
          - name: train
            command: [sleep, inf]
            nodes: 2
          - name: side
            command: [sleep, inf]
            placement: {pool: train}
            metrics: {port: 9000}
            enabled: false
        """)
    assert found == []


def test_t86_declaring_a_kinds_name_changes_it_and_enabled_false_turns_it_off() -> None:
    base = textwrap.dedent("""\
        name: t
        services:
          - name: train
            command: [sleep, inf]
            nodes: 2
        observability:
          exporters: true
        """)
    changed = base.replace(
        "services:\n",
        "services:\n  - name: node-exporter\n    type: node-exporter\n"
        "    placement: {pool: train}\n    options: {port: 9200}\n",
    )
    found = exporters(changed)
    node = sorted(e.url for e in found if e.service == "node-exporter")
    assert node == ["http://127.0.0.2:9200/metrics", "http://127.0.0.3:9200/metrics"]
    services = [(s.name, why) for s, why in effective_services(load_text(changed))]
    # The declared entry takes the implied one's slot (dcgm, then node, as srtctl) and is no
    # longer "implied".
    assert services[:2] == [("dcgm-exporter", "observability.exporters"), ("node-exporter", None)]
    off = base.replace(
        "services:\n",
        "services:\n  - name: node-exporter\n    type: node-exporter\n    enabled: false\n",
    )
    assert {e.service for e in exporters(off)} == {"dcgm-exporter", "process-exporter"}
    _, state = plan_text_source(off, "recipe.yaml")
    assert not any(i.service == "node-exporter" for i in state.instances)


# --- T-88: plan output --------------------------------------------------------------------------


def test_t88_plan_shows_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(POOLS.replace("metrics: {port: 9402}", "metrics: {port: 8003, path: /prom}"))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if " type=" in line}
    assert " metrics=:8003/prom " in lines["engines"]
    assert " metrics=:9401/metrics " in lines["dcgm-exporter"]
    assert " metrics=:9101/metrics " in lines["node-exporter"]
    assert "metrics=" not in lines["miles"]
    named = tmp_path / "named.yaml"
    named.write_text(
        textwrap.dedent("""\
        name: t
        services:
          - name: train
            command: [sleep, inf]
            nodes: 2
            metrics:
              - {port: 9090, name: miles, nodes: first}
              - {port: 31000, path: /engine_metrics, name: engines, nodes: first}
        """)
    )
    assert main(["plan", str(named)]) == 0
    out = capsys.readouterr().out
    assert "metrics=miles:9090/metrics@first,engines:31000/engine_metrics@first" in out


# --- the exporter controller (T-87: the targets file) -------------------------------------------

PROBED = """
name: job1
services:
  - name: app
    command: [sleep, inf]
    nodes: 2
    readiness: {port: 8000}
    metrics: {port: 9000}
  - name: plain
    command: [sleep, inf]
    placement: {node: head}
"""


PROBE_PERIOD = 3.0  # longer than the default readiness interval: one more probe attempt


class FakeScrape:
    def __init__(self) -> None:
        self.up: set[str] = set()
        self.calls: list[str] = []

    async def __call__(self, target: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        self.calls.append(target.url)
        if target.url in self.up:
            return True, f"{target.url} -> 200"
        return False, f"{target.url}: connection refused"


def harness(recipe: str, tmp_path: Path, nodes: int | None = None) -> tuple[Harness, FakeScrape]:
    h = Harness(recipe, tmp_path, nodes)
    scrape = FakeScrape()
    exporter.state_of(h.store).scrape = scrape
    TargetsFile(h.ctx).attach()  # as the runner does: the targets file follows the store
    exporter.start(h.ctx)
    return h, scrape


def targets(tmp_path: Path) -> list[dict[str, Any]]:
    return json.loads((tmp_path / exporter.TARGETS_FILE).read_text())


def test_targets_file_lists_only_ready_instances_with_their_labels(tmp_path: Path) -> None:
    async def body() -> None:
        h, _ = harness(PROBED, tmp_path)
        await h.settle()
        assert h.phase("service_app_node1") == "Starting"
        assert targets(tmp_path) == []  # written (empty) as soon as the job has exporters
        h.prober.ready.add("service_app_node2")
        await h.advance(PROBE_PERIOD)
        assert targets(tmp_path) == [
            {
                "targets": ["127.0.0.3:9000"],
                "labels": {
                    "__metrics_path__": "/metrics",
                    "job": "job1",
                    "service": "app",
                    "node": "node2",
                    "pool": "app",
                    "instance": "service_app_node2",
                    "endpoint": "app_node2",
                },
            }
        ]
        h.prober.ready.add("service_app_node1")
        await h.advance(PROBE_PERIOD)
        assert [t["labels"]["node"] for t in targets(tmp_path)] == ["node1", "node2"]

    run(body())


def test_targets_file_is_rewritten_on_exit_and_only_on_change(tmp_path: Path) -> None:
    async def body() -> None:
        h, _ = harness(PROBED, tmp_path)
        await h.settle()
        h.prober.ready |= {"service_app_node1", "service_app_node2"}
        await h.advance(PROBE_PERIOD)
        state = exporter.state_of(h.store)
        path = tmp_path / exporter.TARGETS_FILE
        assert len(targets(tmp_path)) == 2
        writes, mtime = state.writes, path.stat().st_mtime_ns
        for _ in range(3):  # reconciles with nothing changed write nothing
            h.ctx.queue.add(exporter.KEY)
            await h.advance(1)
        assert (state.writes, path.stat().st_mtime_ns) == (writes, mtime)
        h.exit("service_app_node1", 1)
        await h.advance(1)
        assert [t["labels"]["node"] for t in targets(tmp_path)] == ["node2"]
        assert state.writes == writes + 1

    run(body())


def test_changes_right_after_a_write_are_held_back_briefly(tmp_path: Path) -> None:
    async def body() -> None:
        h, _ = harness(PROBED, tmp_path)
        await h.settle()
        h.prober.ready |= {"service_app_node1", "service_app_node2"}
        await h.advance(PROBE_PERIOD)
        state = exporter.state_of(h.store)
        writes = state.writes
        h.exit("service_app_node1", 1)
        await h.settle()  # same instant as the last write: held back, not lost
        assert len(targets(tmp_path)) == 2 and state.writes == writes
        await h.advance(exporter.WRITE_PERIOD)
        assert len(targets(tmp_path)) == 1 and state.writes == writes + 1

    run(body())


def test_scrape_health_is_recorded_and_flips_are_events(tmp_path: Path) -> None:
    async def body() -> None:
        h, scrape = harness(PROBED, tmp_path)
        await h.settle()
        url1, url2 = "http://127.0.0.2:9000/metrics", "http://127.0.0.3:9000/metrics"
        scrape.up.add(url1)
        h.prober.ready |= {"service_app_node1", "service_app_node2"}
        await h.advance(PROBE_PERIOD)
        rows = {r["url"]: r for r in exporter.rows(h.store)}
        # Not answering yet, but within the startup grace: unknown, no warning.
        assert rows[url2]["up"] is None and "connection refused" in rows[url2]["last_error"]
        await h.advance(exporter.STARTUP_GRACE)
        rows = {r["url"]: r for r in exporter.rows(h.store)}
        assert rows[url1]["up"] is True and rows[url1]["last_error"] is None
        assert rows[url2]["up"] is False and rows[url2]["listed"] is True
        assert h.reasons("instance/service_app_node2").count("ScrapeFailed") == 1
        assert "ScrapeFailed" not in h.reasons("instance/service_app_node1")
        scrape.up.add(url2)
        await h.advance(exporter.SCRAPE_INTERVAL)
        assert h.reasons("instance/service_app_node2").count("ScrapeOk") == 1
        calls = len(scrape.calls)
        await h.advance(exporter.SCRAPE_INTERVAL)
        assert len(scrape.calls) == calls + 2  # every target once per interval
        doc = snapshot(h.store, backend="fake", controller_pid=1)
        health = {(e["node"], e["up"]) for e in doc["exporters"]}
        assert health == {("node1", True), ("node2", True)}
        assert doc["exporters"][0]["last_scrape"] is not None
        h.exit("service_app_node2", 0)
        await h.advance(1)
        rows = {r["url"]: r for r in exporter.rows(h.store)}
        assert rows[url2]["listed"] is False and rows[url2]["up"] is None

    run(body())


EXPO = """
name: expo
services:
  - name: train
    command: [sleep, inf]
    nodes: {nodes}
observability:
  exporters: true
"""


def test_kinds_without_their_binary_are_skipped_with_a_warning(tmp_path: Path) -> None:
    async def body() -> None:
        h, _ = harness(EXPO.format(nodes=2), tmp_path, nodes=4)
        h.backend.missing_programs = {"dcgm-exporter"}
        h.backend.looked.clear()
        exporter.state_of(h.store).found.clear()
        exporter.start(h.ctx)
        await h.settle()
        await h.advance(1)
        looked = [name for what, name in h.backend.looked if what == "binary"]
        assert looked == [  # once per binary
            "dcgm-exporter",
            "prometheus-node-exporter",
            "prometheus-process-exporter",
        ]
        skipped = [e for e in h.events if e.reason == "ExporterSkipped"]
        assert [(e.type, e.message) for e in skipped] == [
            (
                "Warning",
                "dcgm-exporter: binary 'dcgm-exporter' not found on PATH; skipping its 2 "
                "instance(s)",
            )
        ]
        for node in ("node1", "node2"):
            assert h.phase(f"service_dcgm-exporter_{node}") == "Succeeded"
            assert h.backend.launched(f"service_dcgm-exporter_{node}") == 0
            assert h.phase(f"service_train_{node}") == "Running"  # later stages still run
            assert h.phase(f"service_node-exporter_{node}") == "Running"
        assert str(h.store.job.phase) == "Running"
        assert {t["labels"]["service"] for t in targets(tmp_path)} == {
            "node-exporter",
            "process-exporter",
        }

        # Growing the pool live: the new dcgm instances are skipped too, never launched.
        _, new = plan_text_source(
            textwrap.dedent(EXPO.format(nodes=3)),
            "recipe.yaml",
            local_allocation(4),
            h.store.desired.nodes,
        )
        launched = frozenset(n for n, st in h.store.status.items() if st.attempt >= 0)
        edits.apply(h.ctx, new, diff(h.store.desired, new, launched=launched))
        await h.advance(1)
        assert h.phase("service_dcgm-exporter_node3") == "Succeeded"
        assert h.backend.launched("service_dcgm-exporter_node3") == 0
        assert h.phase("service_node-exporter_node3") == "Running"
        assert h.store.job.observed_generation == h.store.job.generation == 2
        assert [e.message for e in h.events if e.reason == "ExporterSkipped"][-1].endswith(
            "skipping its 1 instance(s)"
        )
        listed = [t["labels"] for t in targets(tmp_path)]
        assert sorted(t["node"] for t in listed if t["service"] == "node-exporter") == [
            "node1",
            "node2",
            "node3",
        ]

    run(body())


def test_shrinking_a_pool_drops_its_targets(tmp_path: Path) -> None:
    async def body() -> None:
        h, _ = harness(EXPO.format(nodes=3), tmp_path, nodes=4)
        writer = TargetsFile(h.ctx)
        await h.settle()
        await h.advance(1)
        assert len([t for t in targets(tmp_path) if t["labels"]["service"] == "node-exporter"]) == 3
        _, new = plan_text_source(
            textwrap.dedent(EXPO.format(nodes=2)),
            "recipe.yaml",
            local_allocation(4),
            h.store.desired.nodes,
        )
        edits.apply(h.ctx, new, diff(h.store.desired, new))
        await h.advance(1)
        nodes = {t["labels"]["node"] for t in targets(tmp_path)}
        assert nodes == {"node1", "node2"}
        await h.advance(60)  # the removed instances are gone (fake backend: after SIGTERM)
        writer.finish()
        assert {t["labels"]["node"] for t in targets(tmp_path)} == {"node1", "node2"}

    run(body())


def test_no_targets_file_for_a_job_without_exporters(tmp_path: Path) -> None:
    async def body() -> None:
        h, _ = harness("name: t\nservices:\n  - name: a\n    command: [sleep, inf]\n", tmp_path)
        await h.settle()
        assert not (tmp_path / "prometheus").exists()

    run(body())


# --- srtr's own metrics -------------------------------------------------------------------------

RIDER = """
name: t
services:
  - name: owner
    command: [sleep, inf]
    nodes: 2
    readiness: {port: 8000}
  - name: rider
    command: [sleep, inf]
    placement: {pool: owner}
    restart: {backoff_seconds: 1}
"""


def sample(registry: Any, name: str, labels: dict[str, str] | None = None) -> float | None:
    value = registry.get_sample_value(name, labels or {})
    return None if value is None else float(value)


def test_own_metrics_count_phases_restarts_reconciles_and_probes(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        job = metrics.JobMetrics(h.store, h.ctx.queue, h.clock)
        job.attach(h.ctx)
        try:
            h.prober.ready |= {"service_owner_node1", "service_owner_node2"}
            await h.advance(1)
            await h.advance(metrics.REFRESH_PERIOD)
            reg = job.registry
            assert sample(reg, "srtr_instances", {"phase": "Ready"}) == 2
            assert sample(reg, "srtr_instances", {"phase": "Running"}) == 2
            assert sample(reg, "srtr_instances", {"phase": "Failed"}) == 0
            assert sample(reg, "srtr_generation") == 1
            assert sample(reg, "srtr_observed_generation") == 1
            assert (sample(reg, "srtr_probe_duration_seconds_count", {"probe": "tcp"}) or 0) >= 2
            for controller in ("job", "instance", "probe", "pool", "exporters"):
                count = sample(
                    reg, "srtr_reconcile_duration_seconds_count", {"controller": controller}
                )
                assert count and count >= 1, controller
            h.exit("service_rider_node2", 1)
            await h.settle()
            await h.advance(2)
            labels = {"service": "rider", "node": "node2", "reason": "failure"}
            assert sample(reg, "srtr_restarts_total", labels) == 1
            intents.restart(h.ctx, "service_rider_node1")
            await h.advance(31)
            labels = {"service": "rider", "node": "node1", "reason": "user"}
            assert sample(reg, "srtr_restarts_total", labels) == 1
        finally:
            job.close()

    run(body())


def test_own_metrics_are_served_over_http(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        job = metrics.JobMetrics(h.store, h.ctx.queue, h.clock)
        job.attach(h.ctx)  # as lifecycle does: reconciles and probes are timed
        try:
            url = job.serve("127.0.0.1", 0)
            assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
            h.prober.ready |= {"service_owner_node1", "service_owner_node2"}
            await h.advance(1)
            h.exit("service_rider_node1", 1)
            await h.settle()
            await h.advance(2)
            job.refresh()
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(url, timeout=10).read().decode()
            )
        finally:
            job.close()
        assert 'srtr_instances{phase="Running"}' in text
        assert 'srtr_restarts_total{node="node1",reason="failure",service="rider"} 1.0' in text
        assert "srtr_queue_depth" in text and "srtr_generation 1.0" in text
        assert "srtr_reconcile_duration_seconds_bucket" in text

    run(body())


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("9400", ("0.0.0.0", 9400)),
        ("0", ("0.0.0.0", 0)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9400", ("::1", 9400)),
    ],
)
def test_metrics_port_forms(text: str, parsed: tuple[str, int]) -> None:
    assert metrics.parse_listen(text) == parsed


@pytest.mark.parametrize("text", ["", "x", "70000", "host:", "-1"])
def test_metrics_port_refused(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        metrics.parse_listen(text)


def test_reconcile_timing_reaches_the_hook_only_when_set(tmp_path: Path) -> None:
    from srtr.controllers.manager import process_one

    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        assert h.ctx.on_reconciled is None
        await process_one(h.ctx, "job")  # no hook: nothing to time, nothing breaks
        seen: list[tuple[str, float, int]] = []
        h.ctx.on_reconciled = lambda key, seconds, depth: seen.append((key, seconds, depth))
        await process_one(h.ctx, "job")
        assert [key for key, _, _ in seen] == ["job"] and seen[0][1] >= 0

    run(body())


def test_expand_keeps_exporters_in_desired_state_pure() -> None:
    # The binary check happens at run time only: a plan made on a machine without the
    # exporters still lists their instances and targets.
    state = expand(load_text(EXPO.format(nodes=2)), local_allocation(2))
    assert sum(1 for i in state.instances if i.service == "dcgm-exporter") == 2
    assert sum(1 for e in state.exporters if e.service == "dcgm-exporter") == 2
