"""The job's guard: if the controller dies without cleaning up, kill what it left behind.

`srtr up` starts one guard per job (`python -m srtr.runtime.guard RUN_DIR PID WINDOW`, in its own
session so Ctrl+C does not reach it). It blocks on the controller's pidfd (no polling while
the controller lives). When the controller exits:

- the job ended normally (state.json phase Succeeded/Failed): nothing to do;
- another controller adopted the run dir within WINDOW seconds (`srtr up --adopt`): that
  controller has its own guard, this one leaves;
- otherwise: SIGKILL every recorded instance process group whose pid still has the recorded
  kernel start time, and release a SLURM allocation srtr made. So instances outlive a
  crashed controller by at most WINDOW seconds, which is the adoption window.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from srtr.backends.local import process_start_time

ADOPT_WINDOW = 60.0


def _state(run_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((run_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # already gone
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def reap_orphans(doc: dict[str, Any]) -> int:
    """SIGKILL the recorded instance groups that are still the recorded processes."""
    killed = 0
    for record in doc.get("instances", []):
        identity = record.get("identity") or {}
        pid, start = identity.get("pid"), identity.get("start")
        if pid and start is not None and process_start_time(pid) == start:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    job = doc.get("job", {})
    if job.get("backend") == "slurm" and job.get("slurm_job_id") and job.get("owns_allocation"):
        subprocess.run(
            ["scancel", str(job["slurm_job_id"])], check=False, capture_output=True, timeout=60
        )
    return killed


def guard(run_dir: Path, controller: int, window: float) -> int:
    wait_exit(controller)
    deadline = time.monotonic() + window
    while True:
        doc = _state(run_dir)
        if doc is None:
            return 0
        job = doc.get("job", {})
        if job.get("phase") in ("Succeeded", "Failed"):
            return 0
        successor = job.get("controller_pid")
        if successor and successor != controller and _alive(successor):
            return 0  # adopted: the new controller runs its own guard
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # only inside the adoption window, after the controller is gone
    killed = reap_orphans(doc)
    with open(run_dir / "logs" / "srtr.log", "a", encoding="utf-8") as log:
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
