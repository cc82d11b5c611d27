"""`srtr up` under a low hard `ulimit -n`: a job that cannot fit is refused at once with one
line and exit 2; one that fits runs."""

from __future__ import annotations

import functools
import resource
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, cmdlines_with

pytestmark = pytest.mark.e2e
HARD = 512

RECIPE = """
name: fds
services:
  - name: base
    command: ["sleep", "infinity"]
    nodes: {nodes}
  - name: side
    command: ["sleep", "infinity"]
    placement: {{pool: base}}
"""


def _nofile(hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))


def test_a_job_beyond_the_hard_limit_is_refused_with_one_line(tmp_path: Path) -> None:
    # 400 hollow agents need 800 connections: more than 512 allows, whatever the soft limit.
    run = Run(
        tmp_path,
        RECIPE.format(nodes=400),
        "--hollow",
        preexec=functools.partial(_nofile, HARD),
    )
    try:
        code = run.wait(timeout=60)
    finally:
        run.close()
    assert code == 2
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert "800 instance(s) on 400 node(s) need about" in lines[0]
    assert f"RLIMIT_NOFILE {HARD}" in lines[0]
    assert "Traceback" not in run.err + run.out
    # Refused before anything started: no hollow agents, no state.
    assert not [
        p for p, line in cmdlines_with("srtr.backends.agent.hollow") if str(run.run_dir) in line
    ]
    assert not (run.run_dir / "state.json").exists()


def test_a_job_that_fits_after_the_soft_limit_is_raised_runs(tmp_path: Path) -> None:
    # 150 agents need ~636 descriptors: beyond the soft 256, within the hard 1,024; their
    # 300 instances cost the controller none (the agents hold them).
    run = Run(
        tmp_path,
        RECIPE.format(nodes=150),
        "--hollow",
        preexec=functools.partial(_nofile, 1024),
    )
    try:
        state = run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and sum(i["phase"] == "Running" for i in s["instances"]) == 300
            ),
            timeout=60,
            what="300 hollow instances running",
        )
        assert state["job"]["phase"] == "Running"
        run.signal()
        assert run.finish(gone_within=15.0) == 130
    finally:
        run.close()
    assert "Too many open files" not in run.err
