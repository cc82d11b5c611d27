"""The launchers on a real slurmctld and real slurmd daemons (scripts/slurm-cluster): no
secret in any command line, and (issue 15) the node agents."""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import slurm_util
from e2e_util import Run, cmdlines_with, events, instance, processes_with, tier_order, wait_for

from srtr.backends.agent.protocol import TOKEN_ENV

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster)."""


finish = functools.partial(Run.finish, timeout=120.0)


def no_job_left(name: str) -> None:
    wait_for(lambda: slurm_util.squeue("-n", name) == "", 30, f"SLURM job {name} to be gone")


def running(state: dict) -> bool:
    return state["job"]["phase"] == "Running" and all(
        i["pid"] is not None for i in state["instances"]
    )


SECRET_RECIPE = """
name: ssecret
services:
  - name: holder
    command: ["bash", "-c", "printf %s \\"$HF_TOKEN\\" | sha256sum; exec sleep 1000"]
    env: {{HF_TOKEN: "{secret}"}}
    readiness: {{log: {{pattern: " -"}}, timeout_seconds: 60, interval_seconds: 0.2}}
"""


def secret_value() -> str:
    # Commas, quotes, spaces and `$`: what `--export=K=V` or a shell would mangle.
    return f"hf_{uuid.uuid4().hex}_a,b c'd$e"


def check_secret_delivered(run: Run, name: str, secret: str) -> None:
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert digest in (run.run_dir / "logs" / f"{name}.out").read_text()


def test_a_secret_reaches_its_step_and_no_command_line(tmp_path: Path) -> None:
    """The step's env rides in the srun client's environment, never in argv."""
    secret = secret_value()
    run = Run(
        tmp_path,
        SECRET_RECIPE.format(secret=secret),
        "--backend",
        "slurm",
        env=slurm_util.outside_env(),
    )
    try:
        run.wait_state(
            lambda s: (
                instance(s, "service_holder")["phase"] == "Ready"
                and instance(s, "service_holder")["step"] is not None
            ),
            60,
            "the holder step registered and ready",
        )
        check_secret_delivered(run, "service_holder", secret)
        assert cmdlines_with(secret) == []
        assert cmdlines_with(secret[:20]) == []
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    no_job_left("srtr-ssecret")


# --- the agent launcher ----------------------------------------------------------------------

AGENT = ("--backend", "slurm", "--launcher", "agent")

HOLD = """
name: ahold
services:
  - name: owner
    command:
      - bash
      - -c
      - echo on=$SLURMD_NODENAME want={node} tasks=$SLURM_NTASKS rank=$SLURM_PROCID; exec sleep 1000
    nodes: 4
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.2}
  - name: tuned
    command: ["sleep", "1000"]
    srun_options: {mem: "0"}
  - name: base
    command: ["sleep", "1000"]
    start: before_workers
"""


def srun_clients(job_id: str) -> list[tuple[int, str]]:
    """(pid, argv) of every srun process of this job on this (the head) machine."""
    return [
        (pid, cmdline)
        for pid, cmdline in cmdlines_with("srun")
        if cmdline.startswith(f"srun --jobid {job_id} ")
    ]


def agent_pids(run: Run) -> dict[str, int]:
    """node → pid of the run's agents (their environment carries the run's tag)."""
    found = {}
    for pid in processes_with(run.marker + "\0"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"srtr.backends.agent.node" in argv and not argv[0].endswith(b"srun"):
            node = next(e for e in environ if e.startswith(b"SLURMD_NODENAME="))
            found[node.split(b"=", 1)[1].decode()] = pid
    return found


def agents_up(state: dict) -> bool:
    return state["job"]["phase"] == "Running" and all(
        i["phase"] in ("Running", "Ready") and (i["name"] != "service_tuned" or i["step"])
        for i in state["instances"]
    )


def test_agents_on_every_node_run_restart_and_tear_down_by_tier(tmp_path: Path) -> None:
    run = Run(tmp_path, HOLD, *AGENT, env=slurm_util.outside_env())
    try:
        state = run.wait_state(agents_up, 60, "every instance running")
        job_id = state["job"]["slurm_job_id"]
        assert state["job"]["launcher"] == "agent"
        assert sorted(agent_pids(run)) == ["node1", "node2", "node3", "node4"]
        steps = slurm_util.squeue("--steps", "-j", job_id, "-o", "%j %N").split("\n")
        assert "srtr-agents node[1-4]" in steps
        # The only steps: the agents', and service_tuned's own (srun_options).
        names = sorted(line.split()[0] for line in steps if line.strip())
        assert names == ["service_tuned", "srtr-agents"], steps
        # One srun client for all agents (srun forks a helper: 2 processes), 2 for tuned's.
        assert len(srun_clients(job_id)) == 4, srun_clients(job_id)
        for k in range(1, 5):
            log = (run.run_dir / "logs" / f"service_owner_node{k}.out").read_text()
            # A step of one task on its node, as its own step would show it; not the agents'.
            assert f"on=node{k} want=node{k} tasks=1 rank=0" in log
        victim = instance(state, "service_rider_node3")
        os.kill(victim["pid"], signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_rider_node3")["restarts"] == 1
                and instance(s, "service_rider_node3")["phase"] == "Running"
            ),
            30,
            "the rider restarted by its agent",
        )
        assert instance(state, "service_rider_node3")["pid"] != victim["pid"]
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    seen = events(run.run_dir)
    tier0_exits, tier1 = tier_order(seen)
    assert len(tier0_exits) == 10 and max(tier0_exits) < tier1  # 4 + 4 + tuned + the rider
    no_job_left("srtr-ahold")


def test_a_secret_reaches_an_agents_instance_and_no_command_line(tmp_path: Path) -> None:
    secret = secret_value()
    run = Run(tmp_path, SECRET_RECIPE.format(secret=secret), *AGENT, env=slurm_util.outside_env())
    try:
        run.wait_state(
            lambda s: instance(s, "service_holder")["phase"] == "Ready", 60, "holder ready"
        )
        check_secret_delivered(run, "service_holder", secret)
        assert cmdlines_with(secret) == []
        assert cmdlines_with(secret[:20]) == []
        # The agents' token rides in their srun client's environment, not in its argv.
        assert len(agent_pids(run)) == 1
        assert cmdlines_with(TOKEN_ENV) == []
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    no_job_left("srtr-ssecret")


LOSS = """
name: aloss
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
    critical: true
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
"""


def check_lost_owner(run: Run) -> None:
    state = run.state()
    assert state is not None
    assert instance(state, "service_owner_node2")["phase"] == "Lost"
    assert instance(state, "service_rider_node2")["phase"] in ("Lost", "Stopped")
    assert instance(state, "service_owner_node2")["restarts"] == 0
    assert "critical instance service_owner_node2" in state["job"]["reason"]


def test_a_killed_agent_loses_its_node_within_three_seconds(tmp_path: Path) -> None:
    run = Run(tmp_path, LOSS, *AGENT, env=slurm_util.outside_env())
    try:
        run.wait_state(running, 60, "every instance running")
        victim = agent_pids(run)["node2"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        assert run.wait(60) == 1, run.out + run.err
    finally:
        run.close()
    check_lost_owner(run)
    lost = next(
        e
        for e in events(run.run_dir)
        if (e["reason"], e["object"]) == ("NodeLost", "instance/service_owner_node2")
    )
    assert lost["ts"] - killed_at < 3.0, lost
    wait_for(lambda: not run.leftovers(), 30, "every process of the run to be gone")
    no_job_left("srtr-aloss")


@pytest.mark.timeout(400)
def test_a_dead_slurmd_loses_its_node_through_slurms_node_state(tmp_path: Path) -> None:
    """The agent lives on, heartbeating; SLURM marks the node DOWN and srtr believes it."""
    run = Run(tmp_path, LOSS, *AGENT, env=slurm_util.outside_env())
    try:
        run.wait_state(running, 60, "every instance running")
        os.kill(slurm_util.slurmd_pid("node2"), signal.SIGKILL)
        assert run.wait(180) == 1, run.out + run.err
        check_lost_owner(run)
        lost = [e["message"] for e in events(run.run_dir) if e["reason"] == "NodeLost"]
        assert any("NOT_RESPONDING" in m or "DOWN" in m for m in lost), lost
    finally:
        run.close()
        slurm_util.heal()
    wait_for(lambda: not run.leftovers(), 180, "the lost node's processes to be cleaned up")
    no_job_left("srtr-aloss")


def test_adopt_through_the_agents_after_a_controller_crash(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = Run(tmp_path, HOLD, *AGENT, env=slurm_util.outside_env())
    second: subprocess.Popen[bytes] | None = None
    try:
        state = run.wait_state(agents_up, 60, "every instance running")
        pids = {i["name"]: i["pid"] for i in state["instances"]}
        agents = agent_pids(run)
        run.proc.kill()  # kill -9 the controller: the agents keep their instances
        run.wait(30)
        second = subprocess.Popen(
            [sys.executable, "-m", "srtr", "up", "--adopt", str(run.run_dir), "--headless"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=slurm_util.outside_env(),
        )
        state = run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and agents_up(s),
            60,
            "the new controller to adopt every instance",
        )
        assert {i["name"]: i["pid"] for i in state["instances"]} == pids
        assert all(i["restarts"] == 0 for i in state["instances"])
        assert agent_pids(run) == agents
        second.send_signal(signal.SIGINT)
        assert second.wait(120) == 130
    finally:
        run.close()
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
    wait_for(lambda: not run.leftovers(), 30, "every process of the run to be gone")
    no_job_left("srtr-ahold")
