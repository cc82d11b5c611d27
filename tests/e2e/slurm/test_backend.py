"""The SLURM backend on a real slurmctld and real slurmd daemons (scripts/slurm-cluster);
the tests that matter run under both launchers (`slurm_launchers.LAUNCHERS`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import slurm_util
from tests.support.e2e_util import (
    Run,
    events,
    instance,
    processes_with,
    read_state,
    tier_order,
    wait_for,
)
from tests.support.pty_util import PtyProgram
from tests.support.slurm_launchers import (
    HOLD,
    LAUNCHERS,
    finish,
    job_steps,
    no_job_left,
    running,
    second_node,
    up,
)

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster)."""


REPORTS = '["bash", "-c", "echo on=$SLURMD_NODENAME want={node} ip={node_ip}; exec sleep 1000"]'

POOLS = f"""
name: spools
roles:
  agg: {{nodes: 1, workers: 1, gpus: 8}}
services:
  - name: train
    command: {REPORTS}
    nodes: 2
    readiness: {{log: {{pattern: "on="}}, timeout_seconds: 60, interval_seconds: 0.2}}
  - name: napper
    command: {REPORTS}
    nodes: 1
    readiness: {{log: {{pattern: "on="}}, timeout_seconds: 60, interval_seconds: 0.2}}
  - name: watcher
    command: {REPORTS}
    placement: {{pool: train}}
    readiness: {{log: {{pattern: "on="}}, timeout_seconds: 60, interval_seconds: 0.2}}
benchmark:
  type: custom
  command: >-
    squeue --steps -h -j $SLURM_JOB_ID -o '%j %N';
    echo train pool: $SRT_SERVICE_TRAIN_NODES
"""


def check_pools_run(run: Run, launcher: str = "step") -> None:
    logs = run.run_dir / "logs"
    ips = {f"node{k}": slurm_util.node_ip(f"node{k}") for k in range(1, 5)}
    for name, node in (
        ("service_train_node2", "node2"),
        ("service_train_node3", "node3"),
        ("service_napper", "node4"),
        ("service_watcher_node2", "node2"),
        ("service_watcher_node3", "node3"),
    ):
        text = (logs / f"{name}.out").read_text()
        assert f"on={node} want={node} ip={ips[node]}" in text, (name, text)
    bench = (logs / "benchmark.out").read_text()
    assert "train pool: node2,node3" in bench
    steps = (
        ["srtr-agents node[1-4]"]
        if launcher == "agent"
        else [
            "service_train_node2 node2",
            "service_train_node3 node3",
            "service_napper node4",
            "service_watcher_node3 node3",
        ]
    )
    for line in steps:
        assert line in bench, bench
    state = run.state()
    assert state is not None and state["job"]["backend"] == "slurm"
    assert state["job"]["slurm_job_id"] and state["job"]["launcher"] == launcher
    services = [i for i in state["instances"] if i["kind"] != "benchmark"]
    if launcher == "agent":  # no step of their own: the agents' step runs them
        assert "service_" not in bench, bench
        assert all(i["step"] is None for i in services)
    else:
        assert all(i["step"] is not None for i in services)


def test_pools_recipe_inside_an_allocation(tmp_path: Path) -> None:
    """Inside `salloc`, with no --launcher: the default on SLURM, the node agent."""
    env = slurm_util.outside_env()
    run = Run(tmp_path, POOLS, prefix=("salloc", "-N4", "-J", "srtr-inside"), env=env)
    code = finish(run)
    assert code == 0, run.out + run.err
    check_pools_run(run, "agent")
    no_job_left("srtr-inside")


@LAUNCHERS
def test_pools_recipe_from_outside_allocates_and_releases(tmp_path: Path, launcher: str) -> None:
    """Placement, readiness probes, a benchmark, the allocation made and given back."""
    run = Run(tmp_path, POOLS, *up(launcher), env=slurm_util.outside_env())
    assert finish(run) == 0, run.out + run.err
    check_pools_run(run, launcher)
    no_job_left("srtr-spools")


@LAUNCHERS
def test_ctrl_c_tears_down_by_tier_and_leaves_no_step(tmp_path: Path, launcher: str) -> None:
    run = Run(tmp_path, HOLD, *up(launcher), env=slurm_util.outside_env())
    try:
        state = run.wait_state(running, 60, "every instance running")
        names = sorted(line.split()[0] for line in job_steps(state))
        if launcher == "agent":
            assert names == ["srtr-agents"], names
        else:
            assert sum(n.startswith("service_") for n in names) == 5, names
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    seen = events(run.run_dir)
    tier0_exits, tier1 = tier_order(seen)
    assert tier0_exits and max(tier0_exits) < tier1
    no_job_left("srtr-shold")


def test_closing_the_terminal_of_the_tui_releases_everything(tmp_path: Path) -> None:
    """Issue 12: `srtr up` with its TUI on a terminal that goes away exits 129 within 10 s,
    with no step, no process and no allocation left."""
    recipe = tmp_path / "shold.yaml"
    recipe.write_text(HOLD)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "srtr", "up", str(recipe), "--backend", "slurm"]
    program = PtyProgram([*argv, "--run-dir", str(run_dir)], cwd=ROOT, env=slurm_util.outside_env())
    try:
        program.wait_for_text("service_rider_node2", timeout=60)
        wait_for(lambda: (s := read_state(run_dir)) and running(s), 60, "every step registered")
        program.hang_up()
        assert program.wait(10) == 129
    finally:
        program.kill()
    marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0"
    wait_for(lambda: not processes_with(marker), 10, "every process of the run to be gone")
    no_job_left("srtr-shold")
    state = read_state(run_dir)
    assert state is not None and state["job"]["exit_code"] == 129


@LAUNCHERS
def test_killed_rider_is_restarted(tmp_path: Path, launcher: str) -> None:
    run = Run(tmp_path, HOLD, *up(launcher), env=slurm_util.outside_env())
    try:
        state = run.wait_state(running, 60, "every instance running")
        name = f"service_rider_{second_node(state)}"
        rider = instance(state, name)
        if launcher == "agent":
            os.kill(rider["pid"], signal.SIGKILL)  # its agent's child, on its node
        else:
            job_id = state["job"]["slurm_job_id"]
            argv = ["scancel", "--signal=KILL", "--full", f"{job_id}.{rider['step']}"]
            subprocess.run(argv, check=True)
        state = run.wait_state(
            lambda s: (
                instance(s, name)["restarts"] == 1
                and instance(s, name)["pid"] not in (None, rider["pid"])
                and running(s)
            ),
            60,
            "the rider relaunched",
        )
        if launcher == "step":
            assert instance(state, name)["step"] != rider["step"]
        reasons = [(e["reason"], e["object"]) for e in events(run.run_dir)]
        assert ("BackOff", f"instance/{name}") in reasons
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    no_job_left("srtr-shold")


CRITICAL = """
name: scrit
services:
  - name: db
    command: ["bash", "-c", "sleep 1; exit 3"]
    critical: true
  - name: app
    command: ["sleep", "1000"]
    start: before_workers
"""


def test_critical_failure_releases_the_allocation(tmp_path: Path) -> None:
    run = Run(tmp_path, CRITICAL, "--backend", "slurm", env=slurm_util.outside_env())
    assert finish(run) == 1, run.out + run.err
    state = run.state()
    assert state is not None and "critical instance service_db" in state["job"]["reason"]
    no_job_left("srtr-scrit")


def test_submit_runs_the_job_in_a_batch_allocation(tmp_path: Path) -> None:
    import json
    import sys

    recipe = tmp_path / "pools.yaml"
    recipe.write_text(POOLS)
    run_dir = tmp_path / "submitted"
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "submit", str(recipe), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
        env=slurm_util.outside_env(),
    )
    assert "submitted job" in done.stdout and str(run_dir) in done.stdout

    def ended() -> bool:
        try:
            state = json.loads((run_dir / "state.json").read_text())
        except (OSError, ValueError):
            return False
        return state["job"]["phase"] in ("Succeeded", "Failed")

    wait_for(ended, 120, "the submitted job to end")
    state = json.loads((run_dir / "state.json").read_text())
    assert state["job"]["phase"] == "Succeeded", (run_dir / "logs" / "sbatch.out").read_text()
    assert "train pool: node2,node3" in (run_dir / "logs" / "benchmark.out").read_text()
    no_job_left("srtr-spools")


WALLTIME = """
name: swall
services:
  - name: hold
    command: ["sleep", "1000"]
    stop_grace_seconds: 25
"""


@pytest.mark.timeout(300)
def test_walltime_teardown_starts_before_the_time_limit(tmp_path: Path) -> None:
    run = Run(tmp_path, WALLTIME, "--backend", "slurm", "--time", "1", env=slurm_util.outside_env())
    try:
        state = run.wait_state(running, 60, "every step registered")
        assert state["job"]["end_time"] is not None
        code = finish(run, timeout=90)
    finally:
        run.close()
    assert code == 0, run.out + run.err
    state = run.state()
    assert state is not None and "walltime" in state["job"]["reason"]
    reasons = [e["reason"] for e in events(run.run_dir)]
    assert "Walltime" in reasons and reasons[-1] == "JobSucceeded"
    no_job_left("srtr-swall")


EDIT = """
name: sedit
services:
  - name: pool
    command: ["sleep", "1000"]
    nodes: 4
"""
SIDE = """
  - name: side
    command: ["sleep", "1000"]
    placement: {pool: pool}
"""


@LAUNCHERS
def test_live_edit_adds_and_removes_a_rider(tmp_path: Path, launcher: str) -> None:
    import textwrap

    run = Run(tmp_path, EDIT, *up(launcher), env=slurm_util.outside_env())
    try:
        state = run.wait_state(running, 60, "every instance running")
        before = {i["name"]: i["pid"] for i in state["instances"]}
        run.recipe.write_text(textwrap.dedent(EDIT + SIDE))
        state = run.wait_state(
            lambda s: s["job"]["observed_generation"] == 2 and running(s), 60, "rider added"
        )
        sides = [i for i in state["instances"] if i["service"] == "side"]
        assert sorted(i["node"] for i in sides) == ["node1", "node2", "node3", "node4"]
        now = {i["name"]: i["pid"] for i in state["instances"]}
        assert {n: p for n, p in now.items() if n in before} == before
        names = [line.split()[0] for line in job_steps(state)]
        if launcher == "agent":  # started by the agents: no step of their own
            assert names == ["srtr-agents"], names
        else:
            assert all(f"service_side_node{k}" in names for k in range(1, 5)), names
        run.recipe.write_text(textwrap.dedent(EDIT))
        run.wait_state(
            lambda s: (
                s["job"]["observed_generation"] == 3
                and not any(i["service"] == "side" for i in s["instances"])
            ),
            60,
            "rider removed",
        )
        wait_for(
            lambda: (
                not any("service_side" in line for line in job_steps(state))
                and not any(pid_alive(i["pid"]) for i in sides)
            ),
            30,
            "the riders (and their steps) to be gone",
        )
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    no_job_left("srtr-sedit")


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not): on the test cluster every node is this machine."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return stat not in ("Z", "X")


GROW = """
name: sgrow
services:
  - name: pool
    command: ["sleep", "1000"]
    nodes: {nodes}
  - name: side
    command: ["sleep", "1000"]
    placement: {{pool: pool}}
    env: {{LEVEL: "{level}"}}
"""


def test_live_edits_restart_grow_and_reject_on_slurm(tmp_path: Path) -> None:
    import textwrap

    def save(text: str) -> None:
        tmp = run.recipe.with_suffix(".tmp")
        tmp.write_text(textwrap.dedent(text))
        tmp.replace(run.recipe)

    run = Run(
        tmp_path,
        GROW.format(nodes=2, level=1),
        "--backend",
        "slurm",
        "--launcher",
        "step",  # it follows each instance's step id through the edit
        "--nodes",
        "3",
        env=slurm_util.outside_env(),
    )
    try:
        state = run.wait_state(running, 60, "every step registered")
        before = {i["name"]: i["step"] for i in state["instances"]}
        first, (spare,) = state["carve"]["pools"]["pool"][0], state["carve"]["spares"]
        save(GROW.format(nodes=2, level=2))  # env change: only the riders restart
        state = run.wait_state(
            lambda s: s["job"]["observed_generation"] == 2 and running(s),
            60,
            "env change rolled out",
        )
        steps = {i["name"]: i["step"] for i in state["instances"]}
        assert steps[f"service_pool_{first}"] == before[f"service_pool_{first}"]
        assert steps[f"service_side_{first}"] != before[f"service_side_{first}"]
        save(GROW.format(nodes=2, level=2) + "  - name: [broken\n")  # rejected, nothing moves
        wait_for(
            lambda: any(e["reason"] == "RecipeRejected" for e in events(run.run_dir)),
            30,
            "the broken edit to be rejected",
        )
        save(GROW.format(nodes=3, level=2))  # grow onto the spare
        state = run.wait_state(
            lambda s: (
                s["job"]["observed_generation"] == 3
                and running(s)
                and {f"service_pool_{spare}", f"service_side_{spare}"}
                <= {i["name"] for i in s["instances"]}
            ),
            60,
            f"the pool to grow onto {spare}",
        )
        assert {i["name"]: i["step"] for i in state["instances"] if i["name"] in steps} == steps
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    no_job_left("srtr-sgrow")
