"""Run dirs in daily use (issue 23): a crashed controller whose guard killed everything,
and a run dir that already holds another run. Real `srtr up` processes, local backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, wait_for

pytestmark = pytest.mark.e2e

HOLD = """
name: hold
services:
  - name: owner
    command: ["bash", "-c", "echo serving; exec sleep 1000"]
    nodes: 2
    readiness: {log: {pattern: serving}, interval_seconds: 0.05}
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
"""

QUICK = """
name: quick
services:
  - name: job
    command: ["bash", "-c", "echo run {n}"]
    terminal: true
"""


def srtr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *args], capture_output=True, text=True, timeout=60
    )


def reasons(run_dir: Path) -> list[str]:
    return [e["reason"] for e in events(run_dir)]


def test_adopt_after_the_guard_killed_everything_is_refused_with_the_time(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, HOLD, "--adopt-window", "4")
    try:
        run.wait_state(
            lambda s: s["job"]["phase"] == "Running" and all(i["identity"] for i in s["instances"]),
            what="running",
        )
        run.proc.kill()  # kill -9 the controller: its guard takes over
        run.wait(30)
        wait_for(lambda: (run.run_dir / "guard.json").exists(), 10, "the guard's record")
        status = srtr("status", str(run.run_dir))
        assert f"controller crashed; adopt with srtr up --adopt {run.run_dir} within" in (
            status.stdout
        ), status
        wait_for(lambda: "GuardKilled" in reasons(run.run_dir), 30, "the guard's kill")
        wait_for(lambda: not run.leftovers(), 15, "every instance killed")
        assert "ControllerLost" in reasons(run.run_dir)

        adopt = srtr("up", "--adopt", str(run.run_dir), "--headless")
        assert adopt.returncode == 2, adopt
        assert "its guard killed 4 instance group(s) at" in adopt.stderr
        assert "nothing to adopt" in adopt.stderr
        assert not run.leftovers()  # refused: nothing was restarted
        assert reasons(run.run_dir).count("Started") == 1
        status = srtr("status", str(run.run_dir))
        assert "Nothing is left to adopt" in status.stdout, status
        anew = srtr("up", str(run.recipe), "--run-dir", str(run.run_dir), "--headless")
        assert anew.returncode == 2, anew  # a new run there must say --reuse-run-dir
        assert "holds another run (job hold: controller pid" in anew.stderr
        assert "--reuse-run-dir" in anew.stderr
    finally:
        run.close()


def test_a_run_dir_that_holds_an_ended_run_is_refused_unless_reused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = Run(tmp_path, QUICK.format(n=1), run_dir=run_dir)
    assert first.finish() == 0, first.err
    before = (run_dir / "events.jsonl").read_text()
    log = run_dir / "logs" / "service_job.out"
    assert log.read_text() == "run 1\n"

    (tmp_path / "recipe.yaml").write_text(QUICK.format(n=2))
    again = srtr("up", str(tmp_path / "recipe.yaml"), "--run-dir", str(run_dir), "--headless")
    assert again.returncode == 2, again
    assert f"--run-dir: {run_dir} holds another run (job quick, Succeeded at" in again.stderr
    assert "--reuse-run-dir" in again.stderr
    assert (run_dir / "events.jsonl").read_text() == before  # nothing of it touched
    assert log.read_text() == "run 1\n"

    second = Run(tmp_path, QUICK.format(n=2), "--reuse-run-dir", run_dir=run_dir)
    assert second.finish() == 0, second.err
    assert f"moved the previous run's files to {run_dir / 'previous' / '1'}" in second.err
    assert reasons(run_dir).count("Started") == 1
    assert log.read_text() == "run 2\n"
    old = run_dir / "previous" / "1"
    assert (old / "events.jsonl").read_text() == before
    assert (old / "logs" / "service_job.out").read_text() == "run 1\n"
    assert "run 1" in (old / "recipe.yaml").read_text()
    assert "run 2" in (run_dir / "recipe.yaml").read_text()
