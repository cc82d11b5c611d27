"""The job's guard: if the controller dies without cleaning up, kill what it left behind.

`srtr up` starts one guard per job (`python -m srtr.runtime.guard RUN_DIR PID WINDOW`, in its own
session so Ctrl+C does not reach it). It blocks on the controller's pidfd (no polling while
the controller lives). When the controller exits:

- the job ended normally (state.json phase Succeeded/Failed): nothing to do;
- another controller adopted the run dir within WINDOW seconds (`srtr up --adopt`): that
  controller has its own guard, this one leaves;
- otherwise: SIGKILL every recorded instance process group whose pid still has the recorded
  kernel start time, and release a SLURM allocation srtr made. So instances outlive a
  crashed controller by at most WINDOW seconds, which is the adoption window. Instances
  under node agents (identity marked `agent`) are their agents' to stop: an agent waits
  the same window.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from srtr.backends.procgroup import process_start_time
from srtr.backends.slurm_cmd import scancel_job_argv
from srtr.reconciler.rundir import RunState, StateFileError, pid_alive, read_state

ADOPT_WINDOW = 60.0


def _state(run_dir: Path) -> RunState | None:
    try:
        return read_state(run_dir)
    except StateFileError:
        return None


# While the controller lives, the guard re-reads state.json when it changed, at most this
# often: it must know what to reap even if the run dir vanishes with the controller.
REFRESH_PERIOD = 5.0


class _LastState:
    """The newest state.json the guard could read, kept in memory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.state: RunState | None = None
        self._stamp: int | None = None

    def refresh(self) -> RunState | None:
        try:
            stamp = (self.run_dir / "state.json").stat().st_mtime_ns
        except OSError:
            return None  # gone: keep the last one
        if stamp != self._stamp:
            fresh = _state(self.run_dir)
            if fresh is not None:
                self.state, self._stamp = fresh, stamp
        return self.state


def wait_exit(pid: int, last: _LastState | None = None) -> None:
    """Wait for `pid` to exit, refreshing `last` now and then."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # already gone
    try:
        while not select.select([fd], [], [], REFRESH_PERIOD)[0]:
            if last is not None:
                last.refresh()
    finally:
        os.close(fd)


def reap_orphans(state: RunState) -> int:
    """SIGKILL the recorded instance groups that are still the recorded processes."""
    killed = 0
    for record in state.instances:
        identity = record.get("identity") or {}
        if identity.get("agent"):
            continue  # on its node, its agent's: the agent stops it when the window ends
        pid, start = identity.get("pid"), identity.get("start")
        if pid and start is not None and process_start_time(pid) == start:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    job = state.job
    if job.get("backend") == "slurm" and job.get("slurm_job_id") and job.get("owns_allocation"):
        # One try, no retries: the guard is a tiny process that must not linger.
        subprocess.run(
            scancel_job_argv(str(job["slurm_job_id"])), check=False, capture_output=True, timeout=60
        )
    return killed


def guard(run_dir: Path, controller: int, window: float) -> int:
    last = _LastState(run_dir)
    last.refresh()
    wait_exit(controller, last)
    state = _wait_for_adoption(run_dir, controller, window, last)
    if state is None:
        return 0
    killed = reap_orphans(state)
    log_path = run_dir / "logs" / "srtr.log"
    with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as log:
        log.write(
            f"guard: controller {controller} died and nobody adopted the job within "
            f"{window:g}s; killed {killed} instance group(s)\n"
        )
    return 0


def _wait_for_adoption(
    run_dir: Path, controller: int, window: float, last: _LastState
) -> RunState | None:
    """The state to reap when nobody adopts the job in time; None when there is nothing to do.

    A run dir that vanished cannot be adopted (`srtr up --adopt` needs it): the last state
    the guard read is reaped at once, so nothing of the job outlives it.
    """
    deadline = time.monotonic() + window
    while True:
        if not run_dir.exists():
            return last.state
        state = last.refresh()
        if state is None or state.ended:
            return None
        successor = state.controller_pid
        if successor and successor != controller and pid_alive(successor):
            return None  # adopted: the new controller runs its own guard
        if time.monotonic() >= deadline:
            return state
        time.sleep(0.5)  # only inside the adoption window, after the controller is gone


def start(run_dir: Path, window: float = ADOPT_WINDOW) -> subprocess.Popen[bytes]:
    """Start the guard of the calling controller."""
    return subprocess.Popen(
        [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(os.getpid()), str(window)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":
    sys.exit(guard(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
