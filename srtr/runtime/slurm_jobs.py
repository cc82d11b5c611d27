"""The SLURM side of starting a job: the allocation `srtr up` runs in or asks salloc for, a
crashed job's allocation when it is adopted, and the batch job of `srtr submit`.

SLURM's refusals come back as input errors (`FILE: message`, exit 2) of the verb that met them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srtr.backends.base import NodeInfo
from srtr.backends.slurm import alloc as slurm_alloc
from srtr.backends.slurm import backend as slurm
from srtr.backends.slurm import cmd as slurm_cmd
from srtr.backends.slurm.submit_cmd import BatchJob as BatchJob
from srtr.backends.slurm.submit_cmd import batch_script
from srtr.resources.errors import Problem, RecipeError
from srtr.runtime import guard
from srtr.runtime.request import SlurmFlags


def bad(where: str, message: str) -> RecipeError:
    """An input error: printed as `WHERE: message`, exit 2."""
    return RecipeError(where, [Problem((), message)])


def in_allocation() -> bool:
    """Whether this process runs inside a SLURM allocation (`--backend auto` picks SLURM)."""
    return slurm_alloc.in_allocation()


def allocation(
    name: str, count: int, flags: SlurmFlags, run_dir: Path, window: float
) -> tuple[slurm.SlurmBackend, guard.Started | None]:
    """Discover the allocation we run in, or get one with salloc (released at the end) of
    `count` nodes for the job `name`, with `flags` (resolved against the recipe already).

    For salloc the job's guard starts first, holding the memfd salloc's stderr goes to:
    from then on a kill -9 of srtr cannot leave the allocation behind, pending or granted
    (returned second; the job's lifecycle adopts it)."""
    commands = slurm.SlurmCommands()
    early = None
    try:
        if slurm_alloc.in_allocation():
            found = slurm.discover(commands)
        else:
            if shutil.which("salloc") is None:  # before the guard: nothing to clean up
                raise slurm.SlurmError(slurm_alloc.SALLOC_MISSING)
            print(f"srtr: asking SLURM for {count} node(s) (salloc)...", file=sys.stderr)
            output = os.memfd_create("srtr-salloc", os.MFD_CLOEXEC)
            early = guard.start_mirrored(run_dir, window, salloc_output=output)
            found = slurm.allocate(
                commands,
                nodes=count,
                job_name=f"srtr-{name}",
                partition=flags.partition,
                account=flags.account,
                time_limit=flags.time,
                output=output,
            )
            os.close(output)
            print(
                f"srtr: got allocation {found.job_id}: {', '.join(n.name for n in found.nodes)}",
                file=sys.stderr,
            )
    except slurm.SlurmError as exc:
        raise bad("slurm", str(exc)) from None
    pyxis = slurm.pyxis_available(commands)
    return slurm.SlurmBackend(found, commands=commands, pyxis=pyxis), early


def adopted_allocation(job: Mapping[str, Any], state: Mapping[str, Any]) -> slurm.SlurmBackend:
    """The SLURM allocation of a crashed controller's job, if it still exists."""
    job_id = str(job.get("slurm_job_id") or "")
    commands = slurm.SlurmCommands()
    alive = False
    if job_id:
        try:
            done = commands.run(slurm_cmd.squeue_state_argv(job_id), check=False)
        except slurm.SlurmError as exc:
            raise bad("slurm", str(exc)) from None
        alive = done.returncode == 0 and slurm_cmd.parse_job_running(done.stdout)
    if not alive:
        raise bad("slurm", f"allocation {job_id or '?'} of the job is gone; nothing to adopt")
    found = slurm.Allocation(
        job_id=job_id,
        nodes=[NodeInfo(n["name"], n["ip"]) for n in state["nodes"]],
        owned=bool(job.get("owns_allocation")),
    )
    return slurm.SlurmBackend(found, commands=commands, pyxis=slurm.pyxis_available(commands))


class SubmitFailed(Exception):
    """sbatch could not be run (`where` slurm) or refused the job (`where` sbatch)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(reason)
        self.where = where
        self.reason = reason


def submit(path: Path, job: BatchJob) -> str:
    """Write the batch script of `job` to `path` and submit it; the SLURM job id."""
    path.write_text(batch_script(job), encoding="utf-8")
    try:
        # Once: sbatch is not idempotent, a retry after a timeout could submit twice.
        done = slurm.SlurmCommands(timeout=60.0).run(
            slurm_cmd.sbatch_argv(path), check=False, retry=False
        )
    except slurm.SlurmError as exc:  # not found, or timed out
        raise SubmitFailed("slurm", str(exc)) from None
    if done.returncode != 0:
        raise SubmitFailed("sbatch", done.stderr.strip() or f"exit {done.returncode}")
    return slurm_cmd.parse_sbatch_job_id(done.stdout)
