"""Controller crash and adoption on the local backend (issue 9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance, read_state, wait_for

pytestmark = pytest.mark.e2e

HOLD = """
name: adopt
services:
  - name: owner
    command: ["bash", "-c", "echo serving; exec sleep 1000"]
    nodes: 2
    readiness: {log: {pattern: serving}, interval_seconds: 0.05}
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.1}
"""


def pids(state: dict) -> dict[str, int]:
    return {i["name"]: i["pid"] for i in state["instances"]}


def crash(run: Run) -> dict:
    state = run.wait_state(
        lambda s: s["job"]["phase"] == "Running" and all(i["identity"] for i in s["instances"]),
        30,
        "running",
    )
    run.proc.kill()  # kill -9 the controller
    run.wait(30)
    return state


def test_adopt_takes_over_with_zero_restarts(tmp_path: Path) -> None:
    run = Run(tmp_path, HOLD, "--adopt-window", "60")
    try:
        before = pids(crash(run))
        assert all(pid_alive(p) for p in before.values())
        second = run.adopt()
        state = run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and s["job"]["phase"] == "Running",
            30,
            "the new controller to take over",
        )
        assert pids(state) == before
        assert all(i["restarts"] == 0 for i in state["instances"])
        # Restored statuses read Running at once; the adoption's verdict is its event.
        adopted = wait_for(
            lambda: [e for e in events(run.run_dir) if e["reason"] == "Adopted"],
            30,
            "the adoption's event",
        )
        assert "4 instance(s) adopted, 0 gone" in adopted[0]["message"]
        # The adopted rider still falls to its restart policy when it dies.
        os.kill(before["service_rider_node1"], signal.SIGKILL)
        run.wait_state(
            lambda s: (
                instance(s, "service_rider_node1")["restarts"] == 1
                and instance(s, "service_rider_node1")["phase"] == "Running"
            ),
            30,
            "the adopted rider to be restarted",
        )
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")
    state = read_state(run.run_dir)
    assert state is not None and state["job"]["phase"] == "Failed"


def test_without_adoption_the_guard_kills_the_orphans(tmp_path: Path) -> None:
    run = Run(tmp_path, HOLD, "--adopt-window", "1")
    try:
        before = pids(crash(run))
        assert any(pid_alive(p) for p in before.values())
        wait_for(lambda: not run.leftovers(), 20, "the guard to kill the orphans")
        # The guard says so once it has killed them: a moment after they are gone.
        log = run.run_dir / "logs" / "srtr.log"
        wait_for(lambda: "nobody adopted the job" in log.read_text(), 10, "the guard's line")
    finally:
        run.close()


def test_the_guard_reaps_the_orphans_of_a_run_dir_that_vanished(tmp_path: Path) -> None:
    """kill -9 of the controller, then the run dir removed (a cleaned-up temp dir, a scratch
    purge): nobody can adopt the job any more, and the guard still kills what it left."""
    import shutil

    run = Run(tmp_path, HOLD, "--adopt-window", "600")
    try:
        before = pids(crash(run))
        assert all(pid_alive(p) for p in before.values())
        # The orphans still write into it (their logs), as under a real purge: remove what
        # is there until the directory is gone.
        wait_for(
            lambda: shutil.rmtree(run.run_dir, ignore_errors=True) or not run.run_dir.exists(),
            20,
            "the run dir removed",
        )
        wait_for(lambda: not run.leftovers(), 20, "the guard to kill the orphans")
    finally:
        run.close()
        for pid in run.leftovers():
            os.killpg(pid, signal.SIGKILL)


def test_adopt_refuses_a_finished_or_running_job(tmp_path: Path) -> None:
    run = Run(tmp_path, HOLD)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        busy = subprocess.run(
            [sys.executable, "-m", "srtr", "up", "--adopt", str(run.run_dir)],
            capture_output=True,
            text=True,
        )
        assert busy.returncode == 2 and "belongs to a running job" in busy.stderr
        run.signal(signal.SIGINT)
        run.wait(60)
    finally:
        run.close()
    ended = subprocess.run(
        [sys.executable, "-m", "srtr", "up", "--adopt", str(run.run_dir)],
        capture_output=True,
        text=True,
    )
    assert ended.returncode == 2 and "nothing to adopt" in ended.stderr


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return ") Z " not in handle.read()
    except OSError:
        return False
