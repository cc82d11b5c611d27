"""Which launcher starts an instance: pure, shared by `srtr plan` and the agent backend.

- `process`: a process group on this machine (the local backend);
- `step`: its own srun step, started from the controller (the SLURM backend's default);
- `agent`: a process group that the node agent of its node starts (`srtr up --launcher
  agent`, local or SLURM).

With the agent launcher, an instance that SLURM itself must set up keeps its own step: one
with a container (pyxis), `srun_options`, `cpus_per_task` or `cpu_bind`. On the local
backend there are no steps: those settings are ignored there, and the agent runs it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Launcher(enum.StrEnum):
    PROCESS = "process"
    STEP = "step"
    AGENT = "agent"


def own_step_reasons(
    *,
    container: str | None,
    cpus_per_task: int | None,
    cpu_bind: str | None,
    srun_options: Mapping[str, str],
    export_env: Mapping[str, str] | None = None,
) -> list[str]:
    """The settings that only an srun step of its own can honour; empty when none is set."""
    reasons = []
    if container:
        reasons.append("container")
    if srun_options:
        reasons.append("srun_options")
    if cpus_per_task is not None:
        reasons.append("cpus_per_task")
    if cpu_bind:
        reasons.append("cpu_bind")
    if export_env:
        reasons.append("srun_export_env")  # it promises srun's --export, so it needs srun
    return reasons


def instance_launcher(launcher: Launcher, reasons: list[str], *, steps: bool = True) -> Launcher:
    """The launcher of one instance when the job's is `launcher`. `reasons` are its
    `own_step_reasons`; `steps` is False where there are no srun steps (local)."""
    if launcher is Launcher.AGENT and reasons and steps:
        return Launcher.STEP
    return launcher
