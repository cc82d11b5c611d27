"""Exporters end to end: real node exporters on a pool, a real Prometheus following the run dir.

Needs Debian's `prometheus-node-exporter` and `prometheus` (`scripts/system-deps` installs
them); the tests that need them skip with the reason when they are missing. Nothing here
sleeps a fixed time: every step waits on state.json or on Prometheus' API, with a timeout.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e

NODE_EXPORTER = "prometheus-node-exporter"
PROMETHEUS = "prometheus"
needs_binaries = pytest.mark.skipif(
    shutil.which(NODE_EXPORTER) is None or shutil.which(PROMETHEUS) is None,
    reason=f"needs Debian's {NODE_EXPORTER} and {PROMETHEUS} on PATH "
    "(scripts/system-deps installs them)",
)

RECIPE = """
name: expo
services:
  - name: node-exporter
    type: node-exporter
    placement: {{node: compute}}
    options: {{port: {port}}}
  - name: process-exporter       # the implied one, on a free port: other runs may hold 9256
    type: process-exporter
    options: {{port: {pport}}}
  - name: train
    command: ["sleep", "1000"]
    nodes: {nodes}
observability:
  exporters: true
"""


def free_port(ips: list[str]) -> int:
    """A port nothing listens on at any of `ips` (simulated nodes share one kernel)."""
    for _ in range(200):
        port = random.randint(20000, 60000)
        try:
            for ip in ips:
                with socket.socket() as sock:
                    sock.bind((ip, port))
        except OSError:
            continue
        return port
    raise AssertionError("no free port found")


def get(url: str, timeout: float = 5.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def save(run: Run, text: str) -> None:
    tmp = run.recipe.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    tmp.replace(run.recipe)  # as editors do: the watcher follows the path


def stop(run: Run) -> None:
    if run.proc.poll() is None:
        run.signal(signal.SIGINT)
    run.finish(gone_within=10)


class Prometheus:
    """A real Prometheus scraping the run dir's targets file every second."""

    def __init__(self, tmp_path: Path, targets: Path) -> None:
        self.port = free_port(["127.0.0.1"])
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML: no quoting surprises in the path
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "srtr",
                            "file_sd_configs": [
                                {"files": [str(targets)], "refresh_interval": "1s"}
                            ],
                        }
                    ],
                }
            )
        )
        self.log = tmp_path / "prometheus.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def targets(self) -> list[dict[str, Any]]:
        text = get(f"http://127.0.0.1:{self.port}/api/v1/targets?state=active")
        if text is None:
            return []
        return list(json.loads(text)["data"]["activeTargets"])

    def node_health(self) -> dict[str, str]:
        """node → health of the node-exporter targets Prometheus is scraping."""
        return {
            t["labels"]["node"]: t["health"]
            for t in self.targets()
            if t["labels"].get("service") == "node-exporter"
        }

    def wait_nodes_up(self, nodes: list[str], what: str) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-2000:]}")
            health = self.node_health()
            if sorted(health) == sorted(nodes) and set(health.values()) == {"up"}:
                return self.targets()
            return None

        return wait_for(check, 60, what)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def node_exporters_up(nodes: int):
    """state.json says every node-exporter target is listed and answered srtr's own scrape."""

    def check(state: dict[str, Any]) -> bool:
        rows = [e for e in state["exporters"] if e["service"] == "node-exporter"]
        listed = [e for e in rows if e["listed"]]
        return len(listed) == nodes and all(e["up"] is True for e in listed)

    return check


def converged(generation: int):
    def check(state: dict[str, Any]) -> bool:
        job = state["job"]
        return job["generation"] == generation and job["observed_generation"] == generation

    return check


@needs_binaries
@pytest.mark.timeout(300)
def test_prometheus_follows_the_pool_as_it_grows_and_shrinks(tmp_path: Path) -> None:
    ips = [f"127.0.0.{k + 1}" for k in range(1, 7)]
    port, pport = free_port(ips), free_port(ips)
    run = Run(tmp_path, RECIPE.format(port=port, pport=pport, nodes=4), "--nodes", "6")
    prometheus: Prometheus | None = None
    try:
        state = run.wait_state(
            lambda s: s["job"]["phase"] == "Running" and node_exporters_up(4)(s),
            60,
            "node exporters up on the 4-node pool",
        )
        for k in range(1, 5):
            row = instance(state, f"service_node-exporter_node{k}")
            # node K of the job's loopback block 127.B.0.0/16 (B: whichever was free)
            assert row["node_ip"].startswith("127.") and row["node_ip"].endswith(f".0.{k + 1}")
            text = get(f"http://{row['node_ip']}:{port}/metrics")
            assert text is not None and "node_exporter_build_info" in text, row
        if shutil.which("dcgm-exporter") is None:
            skipped = [e for e in events(run.run_dir) if e["reason"] == "ExporterSkipped"]
            assert [e["message"] for e in skipped] == [
                "dcgm-exporter: binary 'dcgm-exporter' not found on PATH; skipping its 4 "
                "instance(s)"
            ]

        targets_file = run.run_dir / "prometheus" / "targets.json"
        prometheus = Prometheus(tmp_path, targets_file)
        found = prometheus.wait_nodes_up([f"node{k}" for k in range(1, 5)], "4 targets up")
        labels = next(
            t["labels"]
            for t in found
            if t["labels"].get("node") == "node1" and t["labels"]["service"] == "node-exporter"
        )
        assert labels["instance"] == "service_node-exporter_node1"
        assert labels["endpoint"] == "node_exporter_node1"  # srtctl's name (S-110)
        assert labels["pool"] == "train" and labels["job"] == "expo"

        save(run, RECIPE.format(port=port, pport=pport, nodes=6))
        run.wait_state(converged(2), 60, "pool grown to 6 nodes")
        prometheus.wait_nodes_up([f"node{k}" for k in range(1, 7)], "6 targets up")

        save(run, RECIPE.format(port=port, pport=pport, nodes=3))
        state = run.wait_state(
            lambda s: converged(3)(s) and not any(i["node"] == "node4" for i in s["instances"]),
            60,
            "pool shrunk to 3 nodes",
        )
        prometheus.wait_nodes_up([f"node{k}" for k in range(1, 4)], "only 3 targets left")
        listed = json.loads(targets_file.read_text())
        # The node and the process exporter of each of the 3 nodes.
        assert sorted(t["labels"]["endpoint"] for t in listed) == sorted(
            f"{stem}_node{k}" for stem in ("node_exporter", "process_exporter") for k in (1, 2, 3)
        )
    finally:
        if prometheus is not None:
            prometheus.close()
        stop(run)
    assert prometheus is not None and prometheus.proc.returncode is not None
    # A finished job lists nothing, so a Prometheus still pointed at it lets go.
    assert json.loads(targets_file.read_text()) == []


RIDER = """
name: selfmon
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.1}
"""


def test_srtr_serves_its_own_metrics(tmp_path: Path) -> None:
    run = Run(tmp_path, RIDER, "--metrics-port", "127.0.0.1:0")
    try:
        state = run.wait_state(
            lambda s: s["job"]["phase"] == "Running" and s["job"].get("metrics_url"),
            30,
            "job running with metrics",
        )
        url = state["job"]["metrics_url"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        victim = instance(state, "service_rider_node2")
        os.kill(victim["pid"], signal.SIGKILL)
        run.wait_state(
            lambda s: (
                instance(s, "service_rider_node2")["restarts"] == 1
                and instance(s, "service_rider_node2")["phase"] == "Running"
            ),
            30,
            "rider restarted",
        )
        restarted = 'srtr_restarts_total{node="node2",reason="failure",service="rider"} 1.0'
        text = wait_for(
            lambda: (t := get(url)) and restarted in t and 'phase="Running"} 4.0' in t and t,
            30,
            "metrics showing the restart and 4 running instances",
        )
        for name in (
            "srtr_instances",
            "srtr_queue_depth",
            "srtr_generation",
            "srtr_observed_generation",
            "srtr_reconcile_duration_seconds_bucket",
            "srtr_probe_duration_seconds",
        ):
            assert name in text, name
    finally:
        stop(run)
    assert get(url, timeout=2) is None  # the endpoint went away with the job
