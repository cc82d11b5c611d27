"""The environment of an instance the node agent starts: what it passes on of its own, and
the view of a SLURM step of one task on this node that the instance must see.

Standard library and the protocol only, as the node agent it is part of.
"""

from __future__ import annotations

import os

from srtr.backends.agent import protocol as p
from srtr.backends.procgroup import inherited_environment
from srtr.net import tls

_SECRETS = (p.TOKEN_ENV, tls.FINGERPRINT_ENV)  # never passed on to an instance


def inherited_env(inherit_all: bool, node: str) -> dict[str, str]:
    """What the agent passes on of its own environment to every instance (`--inherit`)."""
    if inherit_all:
        return one_task_view({k: v for k, v in os.environ.items() if k not in _SECRETS}, node)
    return inherited_environment()


# What SLURM tells a task about the layout of its step. The agent is one task of a step over
# every node; an instance it starts must see what a step of its own would show it (one task,
# on this node), or a program that reads its rank from SLURM_PROCID/SLURM_NTASKS (PyTorch
# Lightning, MPI launchers) would think it is rank k of n.
_ONE_TASK = {
    "SLURM_NTASKS": "1",
    "SLURM_NPROCS": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_GTIDS": "0",
    "SLURM_NNODES": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1",
}
# The agent's own: its pid, its srun client's ports, the agent step's CPUs per task.
_AGENT_ONLY = (
    "SLURM_TASK_PID",
    "SLURM_SRUN_COMM_HOST",
    "SLURM_SRUN_COMM_PORT",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_CPUS_PER_TASK",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_DISTRIBUTION",
)


def one_task_view(env: dict[str, str], node: str) -> dict[str, str]:
    """`env` (an agent task's) as a single-task step on `node` would show it to its task;
    unchanged outside SLURM."""
    if "SLURM_JOB_ID" not in env:
        return env
    out = {k: v for k, v in env.items() if k not in _AGENT_ONLY}
    out.update(_ONE_TASK)
    out["SLURM_STEP_NODELIST"] = node
    return out
