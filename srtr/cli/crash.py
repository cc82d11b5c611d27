"""What a run dir says about a crashed controller: its guard's record (guard.json).

`srtr status` prints `crash_line` under the job line; `srtr up --adopt` refuses a job whose
guard already killed everything (`killed_by_guard`), since nothing is left to adopt.
"""

from __future__ import annotations

import time
from pathlib import Path

from srtr.store.rundir import (
    GuardDoc,
    Heartbeat,
    RunState,
    pid_alive,
    read_guard,
    read_heartbeat,
)


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def beating_heartbeat(run_dir: Path) -> Heartbeat | None:
    """The heartbeat of a controller of `run_dir` that runs, or None.

    Its heartbeat decides, from any host. On the controller's own machine (same kernel and
    pid namespace, `Heartbeat.same_machine`) its pid is meaningful too, and a dead pid is
    believed at once: `srtr up --adopt` right after a crash need not wait for the heartbeat
    to go stale. That is the one place a pid is looked up, and only where it is ours."""
    heartbeat = read_heartbeat(run_dir)
    if heartbeat is None or not heartbeat.fresh(time.time()):
        return None
    if heartbeat.same_machine() and not pid_alive(heartbeat.pid):
        return None
    return heartbeat


def guard_record(run_dir: Path, state: RunState) -> GuardDoc | None:
    """The guard's record of this state's controller dying, if the job is not over."""
    if state.ended or beating_heartbeat(run_dir) is not None:
        return None
    return read_guard(run_dir, state.controller_pid)


def killed_by_guard(run_dir: Path, state: RunState) -> str | None:
    """Why the job cannot be adopted because its guard killed it, or None."""
    record = guard_record(run_dir, state)
    if record is None or record["killed_at"] is None:
        return None
    return (
        f"controller pid {record['controller_pid']} died at {_clock(record['lost_at'])} and "
        f"nobody adopted the job in time: its guard killed {record['killed']} instance "
        f"group(s) at {_clock(record['killed_at'])}"
    )


def crash_line(run_dir: Path, state: RunState, now: float | None = None) -> str | None:
    """One line for `srtr status` about a controller that died without ending the job."""
    if state.ended or beating_heartbeat(run_dir) is not None:
        return None
    record = read_guard(run_dir, state.controller_pid)
    now = time.time() if now is None else now
    if record is None:
        return f"controller crashed; adopt with srtr up --adopt {run_dir}"
    killed = killed_by_guard(run_dir, state)
    if killed is not None:
        return (
            f"controller crashed; {killed}. Nothing is left to adopt: start it again with "
            f"srtr up RECIPE --run-dir {run_dir} --reuse-run-dir"
        )
    left = record["adopt_until"] - now
    if left > 0:
        return f"controller crashed; adopt with srtr up --adopt {run_dir} within {left:.0f}s"
    return (
        f"controller crashed; the adoption window ended at {_clock(record['adopt_until'])}: "
        "its guard is killing every instance"
    )
