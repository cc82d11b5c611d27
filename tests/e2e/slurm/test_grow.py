"""Pools that outgrow the allocation on the SLURM test cluster (issue 24): a live edit or a
pool's own published count asks SLURM for more nodes through a grow job (a job array, one
node per task, whose batch script runs the node's agent), the pool waits with squeue's
reason while the cluster is full, its owners and riders run on the new nodes once they
joined, a shrink gives the nodes back (the grow job leaves squeue), and nothing of the run
outlives it: a kill -9 of the controller leaves no job, and adoption keeps the grown pool.

Every job here runs on 2 nodes and grows onto 1 or 2 more; the filler that makes the cluster
full takes every other node (2 of the default 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import Run, events, instance, wait_for
from tests.support.slurm_launchers import BatchRun, HostRun, node_of, up

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


RECIPE = """
name: {name}
services:
  - name: web
    command: ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"]
    nodes: {nodes}
    readiness: {{http: {{port: 8080, path: /}}, timeout_seconds: 60, interval_seconds: 0.2}}
  - name: rider
    command: ["sleep", "1000"]
    placement: {{pool: web}}
"""


FILLER = ("sbatch", "--parsable", "-o", "/dev/null")  # no slurm-JOB.out in the cwd


def recipe(name: str, nodes: int | str) -> str:
    return RECIPE.format(name=name, nodes=nodes)


def save(run: Run, name: str, nodes: int | str) -> None:
    run.recipe.write_text(recipe(name, nodes))


def pool(state: dict[str, Any]) -> dict[str, Any]:
    return dict(state["pools"][0])


def all_up(state: dict[str, Any], count: int) -> bool:
    """The pool holds `count` nodes, every server Ready and every rider Running."""
    want = {"web": "Ready", "rider": "Running"}
    return (
        len(pool(state)["nodes"]) == count
        and all(i["phase"] == want[i["service"]] for i in state["instances"])
        and len(state["instances"]) == 2 * count
    )


def grow_jobs(name: str) -> list[str]:
    """`JOBID STATE` of every task of the run's grow jobs in squeue."""
    text = slurm_util.squeue("-r", "-n", f"{name}-grow", "-o", "%i %T")
    return [line.strip() for line in text.splitlines() if line.strip()]


def cancel_all(name: str) -> None:
    """After a failure: no job of the run may stay to hold the cluster's nodes."""
    for job in (name, f"{name}-grow"):  # scancel takes one name at a time
        subprocess.run(["scancel", "-n", job], check=False)


def no_job_of(name: str, timeout: float = 60) -> None:
    """Neither the main job nor a grow job of the run is in squeue."""
    wait_for(
        lambda: not slurm_util.squeue("-n", f"{name},{name}-grow").strip(),
        timeout,
        f"every SLURM job of {name} to be gone",
    )


def grown_nodes(state: dict[str, Any]) -> list[str]:
    return list(state["grow"]["provisioned"])


def status(run: Run) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run.run_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "250"},
    )
    return done.stdout


def test_a_pool_waits_for_a_full_cluster_then_grows_and_shrinks_back(tmp_path: Path) -> None:
    name = "sgrowa"
    run = HostRun(tmp_path, recipe(name, 2), *up("agent"), nodes=2, name=name)
    filler = None
    try:
        run.wait_state(lambda s: all_up(s, 2), 90, "the pool of 2 up")
        # The rest of the cluster is busy: the grow job must wait, and say why.
        rest = len(slurm_util.cluster_nodes()) - 2
        filler = subprocess.run(
            [*FILLER, f"-N{rest}", "-J", f"{name}-filler", "--wrap", "sleep 600"],
            capture_output=True,
            text=True,
            check=True,
            env=slurm_util.outside_env(),
        ).stdout.strip()
        wait_for(lambda: "R" in slurm_util.squeue("-j", filler, "-o", "%t"), 60, "the filler")
        save(run, name, 4)
        waiting = run.wait_state(
            lambda s: "Resources" in (pool(s).get("pending") or ""), 60, "the pool pending"
        )
        job = waiting["grow"]["requests"][0]["id"]
        assert pool(waiting)["pending"] == (
            f"waiting for 2 node(s) from SLURM (job {job}: Resources)"
        )
        assert f"Pending: waiting for 2 node(s) from SLURM (job {job}: Resources)" in status(run)
        assert sorted(grow_jobs(name)) == [f"{job}_1 PENDING", f"{job}_2 PENDING"]
        subprocess.run(["scancel", filler], check=True)
        grown = run.wait_state(lambda s: all_up(s, 4), 120, "the pool grown to 4")
        new = sorted(grown_nodes(grown))
        assert len(new) == 2 and set(new) == set(pool(grown)["nodes"]) - set(pool(waiting)["nodes"])
        for node in new:  # the riders really run there, under the grow job's agent
            rider = instance(grown, f"service_rider_{node}")
            assert node_of(rider["pid"]) == node
        order = [e["reason"] for e in events(run.run_dir)]
        assert order.index("GrowRequested") < order.index("NodesJoined")
        assert order.index("NodesJoined") < order.index("RecipeApplied")

        save(run, name, 2)
        shrunk = run.wait_state(
            lambda s: all_up(s, 2) and not grown_nodes(s), 60, "the pool back to 2"
        )
        assert [r["phase"] for r in shrunk["grow"]["requests"]] == ["Released"]
        wait_for(lambda: not grow_jobs(name), 30, "the grow job gone from squeue")
        run.signal(signal.SIGTERM)
        assert run.finish(120) == 143
        no_job_of(name)  # before the cleanup below, which would hide a leftover
    finally:
        if filler:
            subprocess.run(["scancel", filler], check=False)
        run.close()
        cancel_all(name)


def test_a_kill_9_of_the_controller_on_the_first_node_leaves_no_job(tmp_path: Path) -> None:
    name = "sgrowk"
    run = BatchRun(tmp_path, recipe(name, 2), *up("agent"), nodes=2, name=name)
    try:
        run.wait_state(lambda s: all_up(s, 2), 90, "the pool of 2 up")
        save(run, name, 3)
        run.wait_state(lambda s: all_up(s, 3), 90, "the pool grown to 3")
        assert len(grow_jobs(name)) == 1
        # kill -9 of `srtr up`, the batch script: the main job ends, its guard with it, and
        # the grow job must not outlive them.
        subprocess.run(["scancel", "--batch", "--signal=KILL", run.job()], check=True)
        no_job_of(name)
        run.wait(60)
    finally:
        run.close()
        cancel_all(name)
    wait_for(lambda: not run.leftovers(), 60, "every process of the run to be gone")


def test_adoption_keeps_the_grown_pool_and_gives_its_nodes_back(tmp_path: Path) -> None:
    name = "sgrowd"
    env = slurm_util.outside_env()
    # srtr makes the allocation itself (salloc --no-shell): after a kill -9 it stays for the
    # adopt window, and so do the grow job and its agents.
    run = Run(tmp_path, recipe(name, 2), *up("agent", "--adopt-window", "60"), env=env)
    adopter = None
    try:
        run.wait_state(lambda s: all_up(s, 2), 90, "the pool of 2 up")
        save(run, name, 3)
        grown = run.wait_state(lambda s: all_up(s, 3), 90, "the pool grown to 3")
        (node,) = grown_nodes(grown)
        rider = instance(grown, f"service_rider_{node}")["pid"]
        run.proc.kill()
        run.wait(30)
        adopter = subprocess.Popen(
            [sys.executable, "-m", "srtr", "up", "--adopt", str(run.run_dir), "--headless"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        adopted = run.wait_state(
            lambda s: s["job"]["controller_pid"] == adopter.pid and all_up(s, 3) and "grow" in s,
            90,
            "the new controller to adopt the grown pool",
        )
        assert grown_nodes(adopted) == [node]
        assert instance(adopted, f"service_rider_{node}")["pid"] == rider  # not restarted
        assert len(grow_jobs(name)) == 1
        save(run, name, 2)
        run.wait_state(lambda s: all_up(s, 2) and not grown_nodes(s), 60, "the pool back to 2")
        wait_for(lambda: not grow_jobs(name), 30, "the grow job gone from squeue")
        adopter.send_signal(signal.SIGINT)
        assert adopter.wait(120) == 130
        no_job_of(name)
    finally:
        run.close()
        if adopter is not None and adopter.poll() is None:
            adopter.kill()
            adopter.wait()
        cancel_all(name)


AUTOSCALED = """
name: {name}
services:
  - name: fleet
    command: ["sleep", "1000"]
    nodes: {{min: 1, max: 3, from: {{file: {want}}}, interval_seconds: 0.5, cooldown_seconds: 0}}
  - name: rider
    command: ["sleep", "1000"]
    placement: {{pool: fleet}}
"""


def test_an_autoscaled_pool_follows_its_published_count_on_slurm(tmp_path: Path) -> None:
    name = "sgrows"
    want = tmp_path / "want"
    want.write_text("1\n")
    run = HostRun(
        tmp_path,
        AUTOSCALED.format(name=name, want=want),
        *up("agent"),
        nodes=1,
        name=name,
    )
    try:

        def size(count: int) -> Any:
            return lambda s: (
                len(pool(s)["nodes"]) == count
                and len([i for i in s["instances"] if i["phase"] == "Running"]) == 2 * count
            )

        run.wait_state(size(1), 90, "the fleet of 1 up")
        want.write_text("3\n")
        grown = run.wait_state(size(3), 120, "the fleet grown to 3 by its count")
        assert len(grown_nodes(grown)) == 2
        assert pool(grown)["autoscale"]["desired"] == 3
        scaling = [e["message"] for e in events(run.run_dir) if e["reason"] == "Scaling"]
        assert scaling and "1 → 3" in scaling[0]
        want.write_text("1\n")
        run.wait_state(lambda s: size(1)(s) and not grown_nodes(s), 60, "the fleet back to 1")
        wait_for(lambda: not grow_jobs(name), 30, "the grow job gone from squeue")
        run.signal(signal.SIGTERM)
        assert run.finish(120) == 143
        no_job_of(name)  # before the cleanup below, which would hide a leftover
    finally:
        run.close()
        cancel_all(name)
