"""A service's per-node `setup` on the SLURM test cluster whose nodes are separate hosts
(scripts/slurm-cluster): the setup of each node runs on that host, through the same launch
path as the instances (an srun step, or the node's agent), before the instance there, which
sees what its own host's setup left in its own /tmp. Local backend:
tests/e2e/local/test_node_setup.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import Run, events
from tests.support.slurm_launchers import LAUNCHERS, start, up

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
NODES = ["node1", "node2", "node3"]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster), and needs its
    nodes to be separate hosts."""
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


RECIPE = """
name: snsetup
services:
  - name: pool
    nodes: 3
    terminal: true
    command: [bash, -c, 'echo "{{node}} on $(hostname) sees $(cat {marker})"']
    setup: |
      echo "setup for {{node}} on $(hostname)"
      echo "$(hostname)" > {marker}
"""


@LAUNCHERS
def test_setup_runs_on_each_separate_host_before_its_instance(
    tmp_path: Path, launcher: str
) -> None:
    marker = f"/tmp/srtr-setup-{uuid.uuid4().hex[:8]}"
    run = start(
        "host", tmp_path, RECIPE.format(marker=marker), *up(launcher), nodes=3, name="srtr-nsetup"
    )
    assert Run.finish(run, timeout=120) == 0, run.out + run.err
    logs = run.run_dir / "logs"
    for node in NODES:
        # each node is its own host: its setup ran there, and its instance read its own /tmp
        assert (logs / f"setup_pool_{node}.out").read_text() == f"setup for {node} on {node}\n"
        assert (logs / f"service_pool_{node}.out").read_text() == f"{node} on {node} sees {node}\n"
    assert not Path(marker).exists()  # written on the nodes' own /tmp, not this machine's
    order = [
        e["object"].removeprefix("instance/")
        for e in events(run.run_dir)
        if e["reason"] == "Launched"
    ]
    assert max(order.index(f"setup_pool_{n}") for n in NODES) < min(
        order.index(f"service_pool_{n}") for n in NODES
    )
