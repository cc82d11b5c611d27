"""The launchers on a real slurmctld and real slurmd daemons (scripts/slurm-cluster): no
secret in any command line, and (issue 15) the node agents."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import uuid
from pathlib import Path

import pytest

from srtr.backends.agent.protocol import TOKEN_ENV
from tests.support import slurm_util
from tests.support.e2e_util import Run, cmdlines_with, events, instance, processes_with, wait_for

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


@pytest.mark.parametrize("launcher", ["step", "agent"])
def test_a_secret_reaches_its_instance_and_no_command_line(tmp_path: Path, launcher: str) -> None:
    """A step's env rides in its srun client's environment; an agent's instance's over the
    agents' channel, and the agents' token in their srun client's environment: never argv."""
    secret = secret_value()
    run = Run(
        tmp_path,
        SECRET_RECIPE.format(secret=secret),
        "--backend",
        "slurm",
        "--launcher",
        launcher,
        env=slurm_util.outside_env(),
    )
    try:
        run.wait_state(
            lambda s: (
                instance(s, "service_holder")["phase"] == "Ready"
                and (launcher == "agent" or instance(s, "service_holder")["step"] is not None)
            ),
            60,
            "the holder ready",
        )
        check_secret_delivered(run, "service_holder", secret)
        assert cmdlines_with(secret) == []
        assert cmdlines_with(secret[:20]) == []
        if launcher == "agent":
            assert len(agent_pids(run)) == 1
            assert cmdlines_with(TOKEN_ENV) == []
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


def test_agents_on_every_node_and_steps_where_slurm_must_see_an_instance(tmp_path: Path) -> None:
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
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    no_job_left("srtr-ahold")


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


def test_a_hung_agent_loses_its_node_through_its_silence(tmp_path: Path) -> None:
    """A stopped agent is a hung node: connected, silent. (A killed one is a dead agent on a
    live node, whose kernel closes its connection: it gets a new agent, below.) How soon
    (2 s of silence) is a benchmark's figure, not this test's."""
    run = Run(tmp_path, LOSS, *AGENT, env=slurm_util.outside_env())
    agent = None
    try:
        state = run.wait_state(running, 60, "every instance running")
        node = state["carve"]["pools"]["owner"][1]  # SLURM picks the nodes
        agent = agent_pids(run)[node]
        os.kill(agent, signal.SIGSTOP)
        lost_event = ("NodeLost", f"instance/service_owner_{node}")
        wait_for(
            lambda: lost_event in [(e["reason"], e["object"]) for e in events(run.run_dir)],
            30,
            "the hung node to be lost",
        )
        # Killed now, it lets the agents' step end (a hung node's would not: the controller
        # waits 10 s for it, then kills the step's srun client).
        os.kill(agent, signal.SIGKILL)
        assert run.wait(60) == 1, run.out + run.err
    finally:
        if agent is not None:  # the job's end may have killed it already
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent, signal.SIGKILL)  # its instances die with it
        run.close()
    state = run.state()
    assert state is not None
    assert instance(state, f"service_owner_{node}")["phase"] == "Lost"
    assert instance(state, f"service_rider_{node}")["phase"] in ("Lost", "Stopped")
    assert instance(state, f"service_owner_{node}")["restarts"] == 0
    assert f"critical instance service_owner_{node}" in state["job"]["reason"]
    lost = next(e for e in events(run.run_dir) if (e["reason"], e["object"]) == lost_event)
    assert "silent" in lost["message"], lost
    wait_for(lambda: not run.leftovers(), 30, "every process of the run to be gone")
    no_job_left("srtr-aloss")


JOIN = """
name: ajoin
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
    restart: {backoff_seconds: 0.2}
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.2}
"""


def test_a_killed_agent_gets_a_new_one_through_a_one_node_step(tmp_path: Path) -> None:
    """The node lives: a new agent starts there as `srun -N1 -w node2`, and the instances
    that died with the old one are relaunched through it."""
    run = Run(tmp_path, JOIN, *AGENT, env=slurm_util.outside_env())
    try:
        state = run.wait_state(running, 60, "every instance running")
        job_id = state["job"]["slurm_job_id"]
        head, victim = state["carve"]["pools"]["owner"]  # SLURM picks the nodes
        before = agent_pids(run)
        there = {n: instance(state, f"service_{n}_{victim}")["pid"] for n in ("owner", "rider")}
        os.kill(before[victim], signal.SIGKILL)
        # A relaunched instance has a new pid; until then its record keeps the dead one's.
        state = run.wait_state(
            lambda s: (
                running(s)
                and all(
                    instance(s, f"service_{n}_{victim}")["restarts"] == 1
                    and instance(s, f"service_{n}_{victim}")["pid"] != p
                    for n, p in there.items()
                )
            ),
            60,
            f"{victim}'s instances relaunched by its new agent",
        )
        after = agent_pids(run)
        assert sorted(after) == sorted([head, victim]) and after[head] == before[head]
        assert after[victim] != before[victim]
        assert instance(state, f"service_owner_{head}")["restarts"] == 0
        steps = slurm_util.squeue("--steps", "-j", job_id, "-o", "%j %N").split("\n")
        assert f"srtr-agent-{victim} {victim}" in steps, steps
        assert any(line.startswith("srtr-agents ") for line in steps), steps
        exits = [
            e["message"]
            for e in events(run.run_dir)
            if (e["reason"], e["object"]) == ("Exited", f"instance/service_owner_{victim}")
        ]
        assert exits and "signal 9" in exits[0], exits
        srtr_log = (run.run_dir / "logs" / "srtr.log").read_text()
        assert f"agents: its agent (pid {before[victim]}) died" in srtr_log
        reasons = [e["reason"] for e in events(run.run_dir)]
        assert "NodeLost" not in reasons and state["job"]["phase"] == "Running"
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 30, "every process of the run to be gone")
    no_job_left("srtr-ajoin")
