"""`srtr submit`: a batch job that runs `srtr up --headless` (sbatch), its run dir made and
its source pins decided here, before it waits in the queue."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli.errors import bad
from srtr.cli.run_dir import add_reuse, add_slurm_flags, run_dir_path, slurm_flags

if TYPE_CHECKING:
    from srtr.resources.recipe import Recipe


def add_verbs(verbs: Any) -> None:
    submit = verbs.add_parser("submit", help="submit a batch job that runs `srtr up` (sbatch)")
    submit.add_argument("recipe", help="recipe YAML file")
    submit.add_argument(
        "--nodes", type=int, metavar="N", help="nodes to ask for (default: what the recipe needs)"
    )
    submit.add_argument(
        "--run-dir",
        metavar="DIR",
        help="run dir on the shared filesystem (default outputs/<name>-<UTC>)",
    )
    add_reuse(submit)
    add_slurm_flags(submit, "SLURM {what} (default: resources.*)")
    submit.set_defaults(func=cmd_submit)


def _submit_plan(args: argparse.Namespace) -> tuple[Recipe, int, Path]:
    """The recipe to submit, its node count and its run dir (with the job's source pins);
    refuses what cannot fit and revs that do not resolve."""
    from srtr.resources.effective import allocation_size
    from srtr.resources.expand import local_allocation
    from srtr.resources.loading import load_text, read_text
    from srtr.resources.planning import plan_text_source
    from srtr.runtime.pins import decide_pins, write_pins
    from srtr.runtime.run_dir_setup import create_run_dir

    text = read_text(args.recipe)
    recipe = load_text(text, args.recipe)
    count = args.nodes or allocation_size(recipe)
    plan_text_source(text, args.recipe, local_allocation(count))  # refuse what cannot fit
    pins = decide_pins(recipe, text, args.recipe, {})
    run_dir = create_run_dir(run_dir_path(args, recipe.name)).resolve()
    write_pins(run_dir, pins)
    return recipe, count, run_dir


def cmd_submit(args: argparse.Namespace) -> int:
    """Write a batch script that runs `srtr up --headless` and submit it with sbatch."""
    from srtr.runtime.slurm_jobs import BatchJob, SubmitFailed, submit

    recipe, count, run_dir = _submit_plan(args)
    flags = slurm_flags(args).over(recipe.resources)
    job = BatchJob(
        name=recipe.name,
        nodes=count,
        run_dir=run_dir,
        recipe=Path(args.recipe).resolve(),
        python=sys.executable,
        partition=flags.partition,
        account=flags.account,
        time=flags.time,
    )
    path = run_dir / "submit.sh"
    try:
        job_id = submit(path, job)
    except SubmitFailed as exc:
        hint = f"submit it with `sbatch {shlex.quote(str(path))}` where SLURM is reachable"
        raise bad(exc.where, f"{exc.reason}; the batch script is {path}: {hint}") from None
    print(f"submitted job {job_id}; run dir {run_dir}")
    print(f"follow it with `srtr status {run_dir}` or `srtr tui {run_dir}`")
    return 0
