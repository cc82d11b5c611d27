"""What the SLURM end-to-end suites share: the launchers they run under, the HOLD recipe
and how to tell that its instances run, the job's steps, and a node SLURM drains."""

from __future__ import annotations

import functools
import subprocess

import pytest
import slurm_util
from e2e_util import Run, wait_for

finish = functools.partial(Run.finish, timeout=120.0)

# The tests that matter run under both SLURM launchers: an srun step per instance, and a
# node agent per node (issue 15: the agent path passes the step path's tests).
LAUNCHERS = pytest.mark.parametrize("launcher", ["step", "agent"])


def up(launcher: str, *extra: str) -> tuple[str, ...]:
    return ("--backend", "slurm", "--launcher", launcher, *extra)


def no_job_left(name: str) -> None:
    wait_for(lambda: slurm_util.squeue("-n", name) == "", 30, f"SLURM job {name} to be gone")


HOLD = """
name: shold
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.2}
  - name: base
    command: ["sleep", "1000"]
    start: before_workers
"""


def running(state: dict) -> bool:
    """Every instance runs: registered as a step, or (agents) running under its agent."""
    agent = state["job"]["launcher"] == "agent"
    return state["job"]["phase"] == "Running" and all(
        i["pid"] is not None and i["phase"] in ("Running", "Ready")
        if agent
        else i["step"] is not None
        for i in state["instances"]
    )


def second_node(state: dict) -> str:
    """The owner pool's second node: SLURM picks the nodes (one still completing an earlier
    job is passed over), so tests do not name them."""
    return str(state["carve"]["pools"]["owner"][1])


def job_steps(state: dict) -> list[str]:
    """`name nodes` of every step of the run's job."""
    text = slurm_util.squeue("--steps", "-j", state["job"]["slurm_job_id"], "-o", "%j %N")
    return [line.strip() for line in text.splitlines() if line.strip()]


def drain(node: str, state: str = "drain") -> None:
    """Have SLURM report `node` drained (srtr takes it as lost: docs/agents.md), or back
    (`resume`): the node's loss without the minute a dead slurmd costs."""
    argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
    subprocess.run([*argv, *(["reason=srtr-test"] if state == "drain" else [])], check=True)
