"""A pool with a leader on real processes (examples/scheduler-workers.yaml): instance 0 runs
the scheduler, the workers launch only once it is ready and register with it at {pool_ip},
and a client pool reaches it through {pool_ip:cluster}."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, node_ips

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]


def test_the_leader_runs_first_and_another_pool_reaches_it(tmp_path: Path) -> None:
    run = Run(tmp_path, (ROOT / "examples" / "scheduler-workers.yaml").read_text())
    assert run.finish(90) == 0, run.out + run.err
    logs = run.run_dir / "logs"
    state = run.state()
    assert state is not None
    ip = node_ips(state)["node1"]
    leader = (logs / "service_cluster_node1.out").read_text()
    assert f"scheduler at tcp://{ip}:8786" in leader
    assert "worker node2 registered" in leader and "worker node3 registered" in leader
    assert f"registered with {ip}: ok" in (logs / "service_cluster_node2.out").read_text()
    client = (logs / "service_client.out").read_text()
    assert f"scheduler at {ip} has 2 workers" in client
    seen = [(e["reason"], e["object"]) for e in events(run.run_dir)]
    ready = seen.index(("Ready", "instance/service_cluster_node1"))
    for worker in ("service_cluster_node2", "service_cluster_node3"):
        assert seen.index(("Launched", f"instance/{worker}")) > ready
