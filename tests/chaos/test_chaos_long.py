"""Long chaos and fuzz runs; not part of the normal test run.

    python3 -m pytest -m chaos tests/chaos -p no:cacheprovider
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_fuzz import fuzz_edits, fuzz_recipes
from test_reliability import run_chaos

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


SLURM_CHAOS = """
name: schaos
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 4
  - name: r1
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.05, max_backoff_seconds: 0.2, max_restarts: 1000}
  - name: r2
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.05, max_backoff_seconds: 0.2, max_restarts: 1000}
  - name: r3
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.05, max_backoff_seconds: 0.2, max_restarts: 1000}
"""


@pytest.mark.timeout(400)
@pytest.mark.slurm
def test_chaos_60s_on_16_slurm_steps(tmp_path: Path) -> None:
    """scancel --signal=KILL a random rider step every 100 ms for 60 s on the SLURM cluster."""
    import random
    import signal
    import subprocess
    import time

    import slurm_util
    from e2e_util import Run, events, wait_for

    if not slurm_util.cluster_up():
        reason = slurm_util.start()
        if reason:
            pytest.skip(reason)
    run = Run(tmp_path, SLURM_CHAOS, "--backend", "slurm", env=slurm_util.outside_env())
    rng = random.Random(16)
    kills = 0
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running"
                               and all(i["step"] for i in s["instances"]), 60, "running")
        job_id = state["job"]["slurm_job_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = run.state()
            assert state is not None and run.proc.poll() is None, "the controller died"
            riders = [i for i in state["instances"]
                      if i["kind"] == "rider" and i["phase"] == "Running" and i["step"]]
            if riders:
                victim = rng.choice(riders)
                done = subprocess.run(["scancel", "--ctld", "--signal=KILL", "--full",
                                       f"{job_id}.{victim['step']}"], capture_output=True)
                kills += done.returncode == 0
            time.sleep(0.1)  # the fault rate, not a wait for something observable
        state = run.wait_state(lambda s: all(i["phase"] == "Running" for i in s["instances"]),
                               120, "every rider running again")
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
