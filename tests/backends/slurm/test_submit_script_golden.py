"""Golden file: the batch script `srtr submit examples/pools.yaml` hands to sbatch
(`backends/slurm/submit_cmd.py`), in `tests/resources/golden/pools.sh` beside that example's plans.

The script is a command line SLURM reads: a change to it is reviewed there, as a plan's is.
To (re)write the file, run

    SRTR_UPDATE_GOLDEN=1 python3 -m pytest tests/backends/slurm/test_submit_script_golden.py

and read the diff before committing it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePath

from srtr.backends.slurm.submit_cmd import BatchJob, batch_script
from srtr.resources.effective import allocation_size
from srtr.resources.loading import load_text, read_text
from srtr.runtime.request import SlurmFlags

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "pools.yaml"
GOLDEN = ROOT / "tests" / "resources" / "golden" / "pools.sh"
UPDATE = os.environ.get("SRTR_UPDATE_GOLDEN") == "1"


def pools_job() -> BatchJob:
    """`srtr submit examples/pools.yaml --partition gpu --account proj-1 --time 01:30:00`
    from a fixed interpreter and run dir."""
    recipe = load_text(read_text(EXAMPLE), str(EXAMPLE))
    flags = SlurmFlags("gpu", "proj-1", "01:30:00").over(recipe.resources)
    return BatchJob(
        name=recipe.name,
        nodes=allocation_size(recipe),
        run_dir=PurePath("/shared/runs/pools-1"),
        recipe=PurePath("/home/me/examples/pools.yaml"),
        python="/opt/venv/bin/python3",
        partition=flags.partition,
        account=flags.account,
        time=flags.time,
    )


def test_the_batch_script_matches_its_golden_file() -> None:
    script = batch_script(pools_job())
    if UPDATE:
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text(), (
        "the batch script of `srtr submit` changed; if that is intended, rewrite "
        "tests/resources/golden/pools.sh with SRTR_UPDATE_GOLDEN=1 and review the diff"
    )


def test_flags_not_given_and_not_in_the_recipe_are_left_to_slurm() -> None:
    job = dataclasses.replace(pools_job(), partition=None, account="", time=None)
    script = batch_script(job)
    assert "--partition" not in script and "--account" not in script and "--time" not in script
    assert "#SBATCH --exclusive\n" in script and "#SBATCH --no-kill\n" in script
    assert script.endswith(" --backend slurm --run-dir /shared/runs/pools-1\n")
