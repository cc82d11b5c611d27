"""Watch and stop a submitted job from another node of the separate-hosts cluster (issue 22,
part 2): no socket and no pid of the controller's host is reachable there, and the run dir
path is over 100 characters (no control.sock at all). `srtr status` sees the job running
(heartbeat + squeue), `srtr down` stops it over TCP + TLS, and nothing is left."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import wait_for
from tests.support.slurm_launchers import no_job_left, strays_on

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
NODES = [f"node{k}" for k in range(1, 5)]

WEB = """
name: hctl
services:
  - name: web
    command: ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"]
    nodes: 4
    readiness: {http: {port: 8080, path: /}, timeout_seconds: 60, interval_seconds: 0.2}
    stop_grace_seconds: 5
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: web}
"""


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


def state_of(run_dir: Path) -> dict | None:
    try:
        return dict(json.loads((run_dir / "state.json").read_text()))
    except (OSError, ValueError):
        return None


def srtr_on(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return slurm_util.run_on(node, [sys.executable, "-m", "srtr", *argv])


def test_a_submitted_job_is_watched_and_stopped_from_another_node(tmp_path: Path) -> None:
    run_dir = tmp_path / ("r" * 50) / ("s" * 40) / "run"
    assert len(str(run_dir.resolve() / "control.sock")) > 100
    recipe = tmp_path / "web.yaml"
    recipe.write_text(WEB)
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "submit", str(recipe), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        env=slurm_util.outside_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    try:

        def ready() -> dict | None:
            state = state_of(run_dir)
            if state is None or state["job"]["phase"] != "Running":
                return None
            up = all(i["phase"] in ("Ready", "Running") for i in state["instances"])
            return state if up and len(state["instances"]) == 8 else None

        state = wait_for(ready, 120, "the submitted job Running")
        job_id = state["job"]["slurm_job_id"]
        assert state["job"]["controller_host"] == "node1"  # sbatch runs srtr on the first node
        assert "control" not in state["job"]  # no socket: its path would be too long

        status = srtr_on("node3", "status", str(run_dir))
        assert status.returncode == 0, status.stderr
        assert "controller=running (last heartbeat" in status.stdout, status.stdout
        assert f"SLURM job {job_id}: RUNNING" in status.stdout, status.stdout

        down = srtr_on("node3", "down", str(run_dir))
        assert down.returncode == 0, down.stdout + down.stderr
        assert "tearing down tier by tier" in down.stdout
        wait_for(
            lambda: (s := state_of(run_dir)) is not None and s["job"]["phase"] == "Failed",
            60,
            "the job torn down",
        )
        assert state_of(run_dir)["job"]["reason"] == "torn down by user"  # type: ignore[index]
        after = srtr_on("node2", "status", str(run_dir))
        assert "controller=ended" in after.stdout, after.stdout
    finally:
        subprocess.run(["scancel", "-n", "srtr-hctl"], check=False)  # whatever happened
    no_job_left("srtr-hctl")
    for node in NODES:
        wait_for(lambda n=node: not strays_on(n), 30, f"nothing left on {node}")


HOLD = """
name: hgone
services:
  - name: hold
    command: ["sleep", "1000"]
    nodes: 2
"""


def test_down_from_another_node_offers_scancel_when_the_controller_is_dead(
    tmp_path: Path,
) -> None:
    """The controller (on node1, under sbatch) is killed -9. From node3, `srtr down` cannot
    reach it and says so, with its last heartbeat and the SLURM job's state, and offers
    `scancel <id>` (exit 1); it signals nothing. That scancel ends everything.

    The controller is the batch script's process, so its death ends the batch step: SLURM
    reports the job RUNNING until slurmd tells slurmctld, then COMPLETING; either is the
    state `srtr down` must report, as squeue gives it."""
    run_dir = tmp_path / ("g" * 50) / ("h" * 40) / "run"
    recipe = tmp_path / "hold.yaml"
    recipe.write_text(HOLD)
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "submit", str(recipe), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        env=slurm_util.outside_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    try:
        state = wait_for(
            lambda: (
                (s := state_of(run_dir)) is not None
                and s["job"]["phase"] == "Running"
                and all(i["phase"] == "Running" for i in s["instances"])
                and s
            ),
            120,
            "the submitted job Running",
        )
        job_id = state["job"]["slurm_job_id"]
        pid = json.loads((run_dir / "heartbeat.json").read_text())["pid"]  # as node1 sees it
        killed = slurm_util.run_on("node1", ["kill", "-KILL", str(pid)])
        assert killed.returncode == 0, killed.stderr
        down = srtr_on("node3", "down", str(run_dir))
        assert down.returncode == 1, down.stdout + down.stderr
        assert "cannot reach the controller" in down.stderr
        said = re.search(rf"SLURM job {job_id}: (\w+)\.", down.stderr)
        assert said and said[1] in ("RUNNING", "COMPLETING"), down.stderr
        assert f"`scancel {job_id}`" in down.stderr
        # a job already COMPLETING makes scancel say so and fail: what counts is that it ends
        subprocess.run(["scancel", str(job_id)], check=False, timeout=30)
    finally:
        subprocess.run(["scancel", "-n", "srtr-hgone"], check=False)
    no_job_left("srtr-hgone")
    for node in NODES:
        wait_for(lambda n=node: not strays_on(n), 60, f"nothing left on {node}")
