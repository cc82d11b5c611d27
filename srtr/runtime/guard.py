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


def wait_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # already gone
    try:
        select.select([fd], [], [])
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
    wait_exit(controller)
    deadline = time.monotonic() + window
    while True:
        state = _state(run_dir)
        if state is None or state.ended:
            return 0
        successor = state.controller_pid
        if successor and successor != controller and pid_alive(successor):
            return 0  # adopted: the new controller runs its own guard
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # only inside the adoption window, after the controller is gone
    killed = reap_orphans(state)
    log_path = run_dir / "logs" / "srtr.log"
    with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as log:
        log.write(
            f"guard: controller {controller} died and nobody adopted the job within "
            f"{window:g}s; killed {killed} instance group(s)\n"
        )
    return 0


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
