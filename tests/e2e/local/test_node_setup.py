"""A service's per-node `setup` on real processes (local backend): it runs on each node, in
that node's own /tmp, before the instance there; a failure fails the job with its log.

Each simulated node has its own /tmp (tests/e2e/local/test_node_tmp.py), so a marker the
setup writes under /tmp is seen by that node's instance only. Controller level:
tests/controllers/test_node_setup.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance

pytestmark = pytest.mark.e2e

RECIPE = """
name: nodesetup
services:
  - name: pool
    nodes: 3
    terminal: true
    env: {{GREETING: "prepared"}}
    command: [bash, -c, 'echo "node {{node}} sees $(cat {marker})"']
    setup: |
      echo "setup on {{node}} ({{index}} of {{pool_node_count}})"
      {fail}
      echo "$GREETING {{node}}" > {marker}
"""


@pytest.fixture
def marker() -> Iterator[str]:
    """A path under /tmp that only the nodes' own /tmp may hold, never the host's."""
    path = Path(f"/tmp/srtr-setup-{uuid.uuid4().hex[:8]}")
    yield str(path)
    assert not path.exists(), "a node's setup wrote into the host's /tmp"


def launched(run: Run) -> list[str]:
    return [
        e["object"].removeprefix("instance/")
        for e in events(run.run_dir)
        if e["reason"] == "Launched"
    ]


@pytest.mark.parametrize("launcher", ["process", "agent"])
def test_setup_runs_on_every_node_before_the_instance_there(
    tmp_path: Path, marker: str, launcher: str
) -> None:
    run = Run(tmp_path, RECIPE.format(marker=marker, fail=""), "--launcher", launcher)
    assert Run.finish(run, timeout=60) == 0, run.out + run.err
    logs = run.run_dir / "logs"
    nodes = ["node1", "node2", "node3"]
    for index, node in enumerate(nodes):
        # every instance sees its own node's marker: the setup ran there, before it
        assert (logs / f"service_pool_{node}.out").read_text() == (
            f"node {node} sees prepared {node}\n"
        )
        assert (logs / f"setup_pool_{node}.out").read_text() == f"setup on {node} ({index} of 3)\n"
    order = launched(run)
    setups = [order.index(f"setup_pool_{n}") for n in nodes]
    services = [order.index(f"service_pool_{n}") for n in nodes]
    assert max(setups) < min(services)
    state = run.state()
    assert state is not None
    for node in nodes:
        record = instance(state, f"setup_pool_{node}")
        assert (record["kind"], record["phase"], record["node"]) == ("setup", "Succeeded", node)


def test_a_setup_that_fails_on_one_node_fails_the_job_with_its_log(
    tmp_path: Path, marker: str
) -> None:
    fail = 'if [ {node} = node2 ]; then echo "no disk" >&2; exit 3; fi'
    run = Run(tmp_path, RECIPE.format(marker=marker, fail=fail))
    assert Run.finish(run, timeout=60) == 1, run.out + run.err
    reason = "services[pool] setup on node2 failed (exit 3); see logs/setup_pool_node2.out"
    state = run.state()
    assert state is not None
    assert (state["job"]["phase"], state["job"]["exit_code"]) == ("Failed", 1)
    assert state["job"]["reason"] == reason
    assert f"exit code 1: {reason}" in run.out
    assert (run.run_dir / "logs" / "setup_pool_node2.out").read_text() == (
        "setup on node2 (1 of 3)\nno disk\n"
    )
    assert not [name for name in launched(run) if name.startswith("service_")]
    for node in ("node1", "node2", "node3"):
        assert not (run.run_dir / "logs" / f"service_pool_{node}.out").exists()
    job_events = [e for e in events(run.run_dir) if e["object"] == "job"]
    assert any(reason in e["message"] for e in job_events)
