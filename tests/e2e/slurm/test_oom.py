"""limits.memory with SLURM's step launcher (scripts/slurm-cluster, task/cgroup with
ConstrainRAMSpace): srun gets --mem, SLURM's OOM kill is reported as OOMKilled.

Run as: `flock /tmp/srtr-slurm-tests.lock python3 -m pytest -q tests/test_oom_slurm_e2e.py`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.e2e.local.test_causes import OOM as LOCAL_OOM
from tests.support import slurm_util
from tests.support.e2e_util import Run, events, instance

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster)."""


finish = functools.partial(Run.finish, timeout=180.0)

# The local test's hog, under a name of its own.
OOM = LOCAL_OOM.replace("name: oom", "name: soom", 1)


def test_a_step_over_its_memory_is_oom_killed(tmp_path: Path) -> None:
    run = Run(
        tmp_path,
        OOM,
        "--backend",
        "slurm",
        "--launcher",
        "step",
        env=slurm_util.outside_env(),
    )
    code = finish(run)
    state = run.state()
    assert state is not None, run.err
    log = (run.run_dir / "logs" / "service_hog.out").read_text()
    assert code != 0, (run.err, log)
    cause = state["job"]["cause"]
    assert cause is not None and cause["reason"] == "OOMKilled", (cause, log)
    assert instance(state, "service_hog")["history"][-1]["reason"] == "OOMKilled"
    exited = [e for e in events(run.run_dir) if e["reason"] == "Exited"]
    assert exited and "(OOMKilled)" in exited[-1]["message"], exited
