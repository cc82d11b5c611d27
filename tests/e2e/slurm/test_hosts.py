"""The core job on nodes that are separate hosts (issue 22): every node its own network stack,
hostname and /tmp (scripts/slurm-cluster). A pool of `python3 -m http.server 8080 --bind
0.0.0.0` on 4 nodes with an http probe and a rider, under both launchers, with the controller
on the host (as from `salloc` on a login node) and on the job's first node (as under
`sbatch`): Ready, a SIGKILLed rider repaired, a live edit, SIGTERM teardown, nothing left on
any node."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import instance, wait_for
from tests.support.slurm_launchers import (
    LAUNCHERS,
    PLACES,
    controller_node,
    finish,
    instance_processes,
    no_job_left,
    node_of,
    python_on,
    start,
    strays_on,
    up,
)

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
NODES = [f"node{k}" for k in range(1, 5)]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster), and needs its
    nodes to be separate hosts (skipped, a failure in strict mode, on the fallback)."""
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


WEB = """
name: hweb
services:
  - name: web
    command: ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"]
    nodes: 4
    readiness: {http: {port: 8080, path: /}, timeout_seconds: 60, interval_seconds: 0.2}
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: web}
    restart: {backoff_seconds: 0.2}
"""
EDITED = WEB.replace('["sleep", "1000"]', '["sleep", "1001"]')
GET = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"


def ready(state: dict) -> bool:
    return state["job"]["phase"] == "Running" and all(
        i["phase"] == ("Ready" if i["service"] == "web" else "Running") for i in state["instances"]
    )


def answers(node: str, url: str) -> bool:
    done = python_on(node, GET.replace("sys.argv[1]", repr(url)))
    return done.returncode == 0 and done.stdout.strip() == "200"


@LAUNCHERS
@PLACES
def test_a_pool_of_web_servers_on_separate_hosts(tmp_path: Path, launcher: str, where: str) -> None:
    run = start(where, tmp_path, WEB, *up(launcher), nodes=4, name="srtr-hweb")
    try:
        state = run.wait_state(ready, 90, "every web server Ready, every rider Running")
        assert controller_node(state) == (None if where == "host" else "node1")
        # Every server binds 0.0.0.0:8080 on its own node (one port, four network stacks),
        # answers at its node's IP from the controller's side (the probe) and from another
        # node.
        for k, node in enumerate(NODES):
            (server,) = [
                p
                for p in instance_processes(run, f"service_web_{node}")
                if "http.server" in Path(f"/proc/{p}/cmdline").read_text()
            ]
            assert node_of(server) == node
            assert instance(state, f"service_web_{node}")["node_ip"] == slurm_util.node_ip(node)
            other = NODES[(k + 1) % len(NODES)]
            assert answers(other, f"http://{slurm_util.node_ip(node)}:8080/")
        # `srtr status` on another node sees the run (its run dir is on shared storage).
        status = slurm_util.run_on(
            "node3", [sys.executable, "-m", "srtr", "status", str(run.run_dir)]
        )
        assert "phase=Running" in status.stdout, status.stdout + status.stderr

        # A rider SIGKILLed on its node is relaunched there.
        name = "service_rider_node2"
        (rider,) = instance_processes(run, name)
        assert node_of(rider) == "node2"
        os.kill(rider, signal.SIGKILL)
        run.wait_state(
            lambda s: instance(s, name)["restarts"] == 1 and ready(s), 60, "the rider relaunched"
        )
        (again,) = wait_for(lambda: instance_processes(run, name), 30, "the new rider")
        assert again != rider and node_of(again) == "node2"

        # A live edit of the riders' command rolls it out on every node; servers stay.
        servers = {node: instance(state, f"service_web_{node}")["pid"] for node in NODES}
        run.recipe.write_text(textwrap.dedent(EDITED))
        state = run.wait_state(
            lambda s: s["job"]["observed_generation"] == 2 and ready(s), 60, "the edit rolled out"
        )
        for node in NODES:
            assert instance(state, f"service_web_{node}")["pid"] == servers[node]
            (new,) = wait_for(
                lambda n=node: instance_processes(run, f"service_rider_{n}"), 30, "a new rider"
            )
            assert "1001" in Path(f"/proc/{new}/cmdline").read_text()
            assert node_of(new) == node

        run.signal(signal.SIGTERM)
        assert finish(run) == 143, run.out + run.err
    finally:
        run.close()
    no_job_left("srtr-hweb")
    for node in NODES:
        wait_for(lambda n=node: not strays_on(n), 30, f"nothing left on {node}")
