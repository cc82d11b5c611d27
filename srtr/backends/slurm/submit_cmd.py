"""The batch script of `srtr submit`; pure, like the other SLURM command lines (`slurm_cmd`).

The script asks for whole nodes and runs `srtr up --headless` on the first of them, in the
run dir the submit made; `--no-kill` as for salloc: the loss of one node must not end the
allocation and every step in it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePath


@dataclass(frozen=True, kw_only=True)
class BatchJob:
    """What the script asks SLURM for and runs. `python`: the interpreter that runs srtr
    on the node (the submitter's own: the shared filesystem has it at the same path)."""

    name: str
    nodes: int
    run_dir: PurePath
    recipe: PurePath
    python: str
    partition: str | None = None
    account: str | None = None
    time: str | None = None


def batch_script(job: BatchJob) -> str:
    """The sbatch script: whole nodes, one of them running `srtr up --headless` in the run
    dir."""
    options = [
        f"--job-name=srtr-{job.name}",
        f"--nodes={job.nodes}",
        "--exclusive",
        "--no-kill",
        f"--output={job.run_dir / 'logs' / 'sbatch.out'}",
    ]
    for flag, value in (("partition", job.partition), ("account", job.account), ("time", job.time)):
        if value:
            options.append(f"--{flag}={value}")
    command = [
        job.python,
        "-m",
        "srtr",
        "up",
        str(job.recipe),
        "--headless",
        "--backend",
        "slurm",
        "--run-dir",
        str(job.run_dir),
    ]
    script = "#!/bin/bash\n" + "".join(f"#SBATCH {o}\n" for o in options)
    return script + f"exec {shlex.join(command)}\n"
