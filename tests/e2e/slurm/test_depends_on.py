"""depends_on and per-node setup on the SLURM test cluster whose nodes are separate hosts
(scripts/slurm-cluster): examples/depends-on.yaml with one worker (the cluster has four
nodes), under each launcher. The init service runs first on its host, the scheduler once it
exited 0, the worker's setup and then the worker once the scheduler is ready, reaching it on
another host through `{pool_ip:scheduler}`; killing the scheduler restarts it and then the
worker. Local backend: tests/e2e/local/test_depends_on.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import Run, events, instance
from tests.support.slurm_launchers import LAUNCHERS, instance_processes, start, up

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = (ROOT / "examples" / "depends-on.yaml").read_text()
WORKER = "service_workers"  # alone in its pool: named after its service only


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


def _one_worker(recipe: str) -> str:
    first = recipe.index("  - name: workers\n    nodes: 2\n")
    return recipe[:first] + recipe[first:].replace("nodes: 2", "nodes: 1", 1)


@LAUNCHERS
def test_the_example_runs_in_dependency_order_across_hosts(tmp_path: Path, launcher: str) -> None:
    run = start("host", tmp_path, _one_worker(EXAMPLE), *up(launcher), nodes=4, name="srtr-deps")
    assert Run.finish(run, timeout=180) == 0, run.out + run.err
    logs = run.run_dir / "logs"
    assert "has 1 workers" in (logs / "service_client.out").read_text()
    # the setup ran on the worker's own host, whichever node of the allocation that is (the
    # shared cluster's other tests may hold the first nodes)
    state = run.state()
    assert state is not None
    node = instance(state, WORKER)["node"]
    assert instance(state, f"setup_workers_{node}")["node"] == node
    assert (logs / f"setup_workers_{node}.out").exists()
    assert f"has the shard of {node}" in (logs / f"{WORKER}.out").read_text()
    seen = [(e["reason"], e["object"]) for e in events(run.run_dir)]
    assert seen.index(("Exited", "instance/service_prepare")) < seen.index(
        ("Launched", "instance/service_scheduler")
    )
    ready = seen.index(("Ready", "instance/service_scheduler"))
    assert seen.index(("Launched", f"instance/setup_workers_{node}")) > ready
    assert seen.index(("Launched", f"instance/{WORKER}")) > ready


@LAUNCHERS
def test_killing_the_scheduler_restarts_it_and_then_its_worker(
    tmp_path: Path, launcher: str
) -> None:
    held = _one_worker(EXAMPLE[: EXAMPLE.index("  - name: client")])
    run = start("host", tmp_path, held, *up(launcher), nodes=3, name="srtr-deps-kill")
    try:
        run.wait_state(
            lambda s: instance(s, WORKER)["phase"] == "Ready", 120, "the worker to be ready"
        )
        (pid,) = instance_processes(run, "service_scheduler")
        os.kill(pid, signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_scheduler")["attempt"] == 1
                and instance(s, WORKER)["attempt"] == 1
                and instance(s, WORKER)["phase"] == "Ready"
            ),
            90,
            "the scheduler and then its worker to restart",
        )
        assert instance(state, WORKER)["restarts"] == 0  # restarted with it: no budget spent
        why = [
            e["message"]
            for e in events(run.run_dir)
            if e["object"] == f"instance/{WORKER}" and e["reason"] == "DependencyRestarted"
        ]
        assert why and why[0].startswith("services[scheduler] restarted"), why
        log = (run.run_dir / "logs" / "service_scheduler.out").read_text()
        assert "registered; 1 in all" in log.rsplit("scheduler at tcp://", 1)[1]
    finally:
        run.signal(signal.SIGINT)
        Run.finish(run, timeout=90)
