"""Long chaos and fuzz runs; not part of the normal test run.

python3 -m pytest -m chaos tests/chaos -p no:cacheprovider
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.local.test_faults import CHAOS_RECIPE, chaos, run_chaos
from tests.resources.test_fuzz import fuzz_edits, fuzz_recipes

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(300)
def test_chaos_60s_on_64_instances(tmp_path: Path) -> None:
    run_chaos(tmp_path, 60)


@pytest.mark.timeout(1800)
def test_fuzz_10000_recipes() -> None:
    fuzz_recipes(int(os.environ.get("SRTR_FUZZ_CASES", "10000")))


@pytest.mark.timeout(1800)
def test_fuzz_10000_live_edits() -> None:
    fuzz_edits(int(os.environ.get("SRTR_FUZZ_CASES", "10000")))


SLURM_CHAOS = CHAOS_RECIPE.format(name="schaos", nodes=4)


@pytest.mark.timeout(400)
@pytest.mark.slurm
def test_chaos_60s_on_16_slurm_steps(tmp_path: Path) -> None:
    """scancel --signal=KILL a random rider step every 100 ms for 60 s on the SLURM cluster."""
    import signal
    import subprocess

    from tests.support import slurm_util
    from tests.support.e2e_util import Run, events, wait_for

    if not slurm_util.cluster_up():
        reason = slurm_util.start()
        if reason:
            pytest.skip(reason)
    run = Run(tmp_path, SLURM_CHAOS, "--backend", "slurm", env=slurm_util.outside_env())
    try:
        state = run.wait_state(
            lambda s: s["job"]["phase"] == "Running" and all(i["step"] for i in s["instances"]),
            60,
            "running",
        )
        job_id = state["job"]["slurm_job_id"]

        def scancel(victim: dict) -> bool:
            done = subprocess.run(
                ["scancel", "--ctld", "--signal=KILL", "--full", f"{job_id}.{victim['step']}"],
                capture_output=True,
            )
            return done.returncode == 0

        kills = chaos(run, 60, 0.1, seed=16, kill=scancel, handle="step")
        state = run.wait_state(
            lambda s: all(i["phase"] == "Running" for i in s["instances"]),
            120,
            "every rider running again",
        )
        assert kills > 0 and sum(i["restarts"] for i in state["instances"]) <= kills
        run.signal(signal.SIGINT)
        assert run.wait(120) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 30, "nothing left")
    exited = sum(e["reason"] == "Exited" for e in events(run.run_dir))
    launched = sum(e["reason"] == "Launched" for e in events(run.run_dir))
    assert exited == launched
    assert slurm_util.squeue("-n", "srtr-schaos") == ""
