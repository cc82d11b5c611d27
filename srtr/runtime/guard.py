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

The controller also mirrors every state.json it writes into a memfd the guard holds
(`StateMirror`): a run dir removed right after a kill -9 (a purged scratch dir) would
otherwise leave the guard only its last periodic read, which can predate the newest launches.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from srtr.backends.procgroup import process_start_time
from srtr.backends.slurm_cmd import scancel_job_argv
from srtr.reconciler.rundir import STATE_FILE, RunState, StateFileError, pid_alive, read_state

ADOPT_WINDOW = 60.0


def _state(run_dir: Path) -> RunState | None:
    try:
        return read_state(run_dir)
    except StateFileError:
        return None


# While the controller lives, the guard re-reads state.json when it changed, at most this
# often: it must know what to reap even if the run dir vanishes with the controller.
REFRESH_PERIOD = 5.0


class StateMirror:
    """The controller's side: a memory file the guard inherits, rewritten with each state.json.

    Not atomic: a kill -9 in the middle of a write leaves a torn document, which the guard
    cannot parse and so ignores (it falls back to state.json, then to its last read).
    """

    def __init__(self) -> None:
        self.fd = os.memfd_create("srtr-state", os.MFD_CLOEXEC)

    def write(self, text: str) -> None:
        data = text.encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _read_mirror(fd: int, run_dir: Path) -> RunState | None:
    try:
        size = os.fstat(fd).st_size
        doc = json.loads(os.pread(fd, size, 0)) if size else None
        return RunState.from_doc(doc, run_dir / STATE_FILE) if doc is not None else None
    except (OSError, ValueError, StateFileError):
        return None


class _LastState:
    """The newest state the guard could read, kept in memory: the controller's mirror when it
    has one (always current), else state.json."""

    def __init__(self, run_dir: Path, mirror_fd: int | None = None) -> None:
        self.run_dir = run_dir
        self.mirror_fd = mirror_fd
        self.state: RunState | None = None
        self._stamp: int | None = None

    def refresh(self) -> RunState | None:
        if self.mirror_fd is not None:
            mirrored = _read_mirror(self.mirror_fd, self.run_dir)
            if mirrored is not None:
                self.state = mirrored
                return mirrored
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


def guard(run_dir: Path, controller: int, window: float, mirror_fd: int | None = None) -> int:
    last = _LastState(run_dir, mirror_fd)
    if mirror_fd is None:
        last.refresh()  # with a mirror, reading once after the controller exits is enough
    wait_exit(controller, None if mirror_fd is not None else last)
    last.refresh()
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
        # Adoption shows in state.json, which a successor writes (the mirror is ours alone).
        on_disk = _state(run_dir) if last.mirror_fd is not None else last.refresh()
        state = last.state if on_disk is None else on_disk
        if state is None or state.ended or (last.state is not None and last.state.ended):
            return None
        successor = state.controller_pid
        if successor and successor != controller and pid_alive(successor):
            return None  # adopted: the new controller runs its own guard
        if time.monotonic() >= deadline:
            return last.state
        time.sleep(0.5)  # only inside the adoption window, after the controller is gone


def start(
    run_dir: Path, window: float = ADOPT_WINDOW, mirror: StateMirror | None = None
) -> subprocess.Popen[bytes]:
    """Start the guard of the calling controller."""
    argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(os.getpid()), str(window)]
    if mirror is not None:
        argv.append(str(mirror.fd))
    return subprocess.Popen(
        argv,
        pass_fds=(mirror.fd,) if mirror is not None else (),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":
    mirror_arg = int(sys.argv[4]) if len(sys.argv) > 4 else None
    sys.exit(guard(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), mirror_arg))
