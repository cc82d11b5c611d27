"""The discovery plane and the process exporter end to end, on the local backend.

Real Debian `etcd`, `etcdctl`, `nats-server` and `prometheus-process-exporter` (installed by
`scripts/system-deps`). A pool's instances store keys in the job's etcd through
`$ETCD_ENDPOINTS`; the benchmark reads them back (etcdctl, and curl on etcd's v3 HTTP gateway)
and reads NATS's `INFO` line from `$NATS_SERVER` over plain TCP. Ports are picked free, as in
tests/e2e/local/test_exporters.py: simulated nodes share one kernel, and other runs may be up.
Nothing sleeps a fixed time: every wait is on state.json or a file, with a timeout.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local.test_exporters import free_port
from tests.support.e2e_util import Run, events, instance, node_ips, wait_for

pytestmark = pytest.mark.e2e

TOOLS = ("etcd", "etcdctl", "nats-server", "curl")
needs_plane = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS),
    reason=f"needs {', '.join(TOOLS)} on PATH (scripts/system-deps installs them)",
)
PROCESS_EXPORTER = "prometheus-process-exporter"
needs_process_exporter = pytest.mark.skipif(
    shutil.which(PROCESS_EXPORTER) is None,
    reason=f"needs Debian's {PROCESS_EXPORTER} on PATH (scripts/system-deps installs it)",
)

# @...@ tokens, not str.format: the recipe is full of shell and JSON braces.
PLANE = r"""
name: disc
services:
  - name: etcd
    type: etcd
    options: {port: @ETCD@, peer_port: @PEER@}
  - name: nats
    type: nats
    options: {port: @NATS@, max_payload_mb: 2}
  - name: train
    nodes: 2
    command:
      - bash
      - -c
      - >-
        etcdctl --endpoints "$ETCD_ENDPOINTS" put key-{node} value-{node}
        && echo stored; exec sleep 1000
    readiness: {log: {pattern: "stored"}, timeout_seconds: 60}
benchmark:
  type: custom
  command: |
    set -e
    for n in ${SRT_SERVICE_TRAIN_NODES//,/ }; do
      echo "get $n: $(etcdctl --endpoints "$ETCD_ENDPOINTS" get key-$n --print-value-only)"
    done
    echo "gateway: $(curl -sS -X POST "$ETCD_ENDPOINTS/v3/kv/range" -d '{"key":"a2V5LW5vZGUy"}')"
    hp=${NATS_SERVER#nats://}
    exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}"
    read -r line <&3
    echo "nats: $line"
"""


def plane_recipe() -> str:
    ips = ["127.0.0.2", "127.0.0.3"]
    ports = {"@ETCD@": free_port(ips), "@PEER@": free_port(ips), "@NATS@": free_port(ips)}
    text = PLANE
    for token, port in ports.items():
        text = text.replace(token, str(port))
    return text


@needs_plane
@pytest.mark.timeout(180)
def test_a_pool_stores_keys_in_the_jobs_etcd_and_the_benchmark_reads_them_and_nats(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, plane_recipe(), "--nodes", "2")
    try:
        code = run.finish(timeout=120)
    finally:
        run.close()
    logs = run.run_dir / "logs"
    bench = (logs / "benchmark.out").read_text()
    assert code == 0, (run.err, bench)
    assert "get node1: value-node1\n" in bench
    assert "get node2: value-node2\n" in bench
    gateway = json.loads(bench.split("gateway: ", 1)[1].splitlines()[0])
    assert base64.b64decode(gateway["kvs"][0]["value"]) == b"value-node2"
    nats = bench.split("nats: ", 1)[1].splitlines()[0]
    assert nats.startswith("INFO {"), nats
    info = json.loads(nats[len("INFO ") :])
    assert info["max_payload"] == 2 * 1024 * 1024  # options.max_payload_mb took effect
    assert info["jetstream"] is True
    # Per-node data dirs in the run dir, not a shared /tmp/etcd.
    assert (run.run_dir / "data" / "etcd-node1" / "member").is_dir()
    assert (run.run_dir / "data" / "nats-node1.conf").is_file()
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Succeeded"
    etcd = instance(state, "service_etcd")
    assert etcd["node"] == "node1"


PROCS = """
name: procs
services:
  - name: procs
    type: process-exporter
    options: {port: @PORT@}
  - name: train
    command: [sleep, "1000"]
    nodes: 2
"""


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def procs_up(state: dict[str, Any]) -> bool:
    rows = [e for e in state["exporters"] if e["service"] == "procs"]
    return len(rows) == 2 and all(e["listed"] and e["up"] is True for e in rows)


@needs_process_exporter
@pytest.mark.timeout(180)
def test_process_exporters_serve_metrics_and_are_listed_as_targets(tmp_path: Path) -> None:
    port = free_port(["127.0.0.2", "127.0.0.3"])
    run = Run(tmp_path, PROCS.replace("@PORT@", str(port)), "--nodes", "2")
    try:
        run.wait_state(procs_up, 60, "both process exporters listed and scraped")
        targets = json.loads((run.run_dir / "prometheus" / "targets.json").read_text())
        endpoints = sorted(
            t["labels"]["endpoint"] for t in targets if t["labels"]["service"] == "procs"
        )
        assert endpoints == ["process_exporter_node1", "process_exporter_node2"]
        assert (run.run_dir / "process-exporter.yml").read_text().startswith("# Written by srtr")
        state = run.state()
        assert state is not None
        node2 = node_ips(state)["node2"]
        text = wait_for(
            lambda: get(f"http://{node2}:{port}/metrics"), 30, "process exporter metrics"
        )
        # The group file groups by command name: the pool's `sleep` is a group.
        assert 'namedprocess_namegroup_num_procs{groupname="sleep"}' in text
        run.signal(signal.SIGINT)
        assert run.finish(timeout=60) in (0, 130)
    finally:
        run.close()


@pytest.mark.timeout(120)
def test_a_missing_process_exporter_binary_is_skipped_with_an_event(tmp_path: Path) -> None:
    recipe = PROCS.replace("{port: @PORT@}", "{binary: srtr-no-such-process-exporter}")
    run = Run(tmp_path, recipe, "--nodes", "2")
    try:
        state = run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and instance(s, "service_procs_node1")["phase"] == "Succeeded"
            ),
            60,
            "job running with the exporter skipped",
        )
        assert instance(state, "service_train_node1")["phase"] == "Running"
        skipped = [e["message"] for e in events(run.run_dir) if e["reason"] == "ExporterSkipped"]
        assert skipped == [
            "process-exporter: binary 'srtr-no-such-process-exporter' not found on PATH; "
            "skipping its 2 instance(s)"
        ]
        run.signal(signal.SIGINT)
        run.finish(timeout=60)
    finally:
        run.close()


EXTERNAL = """
name: ext
services:
  - name: etcd
    type: etcd
    external: http://127.0.0.1:@PORT@
benchmark:
  type: custom
  command: |
    etcdctl --endpoints "$ETCD_ENDPOINTS" put from-job yes >/dev/null
    echo "got: $(etcdctl --endpoints "$ETCD_ENDPOINTS" get from-job --print-value-only)"
"""


@needs_plane
@pytest.mark.timeout(120)
def test_an_external_etcd_is_used_and_nothing_is_launched(tmp_path: Path) -> None:
    port, peer = free_port(["127.0.0.1"]), free_port(["127.0.0.1"])
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "etcd.log").open("w") as log:
        etcd = subprocess.Popen(
            [
                "etcd",
                "--data-dir",
                str(tmp_path / "etcd-data"),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: get(f"{url}/health") is not None, 60, "the outside etcd to answer")
        run = Run(tmp_path, EXTERNAL.replace("@PORT@", str(port)))
        try:
            code = run.finish(timeout=60)
        finally:
            run.close()
        bench = (run.run_dir / "logs" / "benchmark.out").read_text()
        assert code == 0, (run.err, bench)
        assert "got: yes\n" in bench
        state = run.state()
        assert state is not None
        assert [i["name"] for i in state["instances"]] == ["benchmark"]  # no etcd launched
    finally:
        etcd.terminate()
        etcd.wait(30)
