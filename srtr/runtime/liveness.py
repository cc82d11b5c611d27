"""Is the job of a run dir alive? From its controller's heartbeat and its SLURM job's state.

Any host that sees the run dir can answer, the controller's or not: the heartbeat is a file
of the run dir (`rundir.read_heartbeat`, rewritten every second), and the SLURM job's state
is one `squeue` away wherever SLURM is reachable. A pid is never looked up: on another host
(or another pid namespace) it is someone else's process.

- `running`: the heartbeat is fresh (`rundir.HEARTBEAT_STALE`) and SLURM, when asked, does
  not say the job has ended. The controller can then be driven (`srtr down`, the TUI).
- otherwise the controller is gone or stuck; `describe()` says what is known (last beat,
  where, the SLURM job's id and state) for `srtr status` and `srtr down`.

`srtr status`, `srtr down` and `srtr tui` call `check`; the TUI's view reads only the
heartbeat (every frame: it must not run squeue five times a second).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from srtr.backends.slurm.cmd import squeue_state_argv
from srtr.store.rundir import Heartbeat, RunState, read_heartbeat

SQUEUE_TIMEOUT = 2.0
# The states of a SLURM job whose processes may still run (squeue's %T).
SLURM_LIVE = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING"}
)


@dataclass(frozen=True)
class Liveness:
    """What a host that sees the run dir knows about its controller."""

    ended: bool  # state.json says the job has ended
    heartbeat: Heartbeat | None
    age: float | None  # seconds since the last beat
    slurm_job_id: str | None
    slurm_state: str | None  # squeue's word; "" when it no longer lists the job; None: unknown
    slurm_error: str | None = None  # why slurm_state is unknown, when SLURM was asked
    fresh: bool = False  # the heartbeat is recent and not the controller's last

    @property
    def stopped(self) -> bool:
        return self.heartbeat is not None and bool(self.heartbeat.doc.get("stopped"))

    @property
    def slurm_ended(self) -> bool:
        """SLURM says the job's allocation is over (not merely unknown)."""
        return self.slurm_state is not None and self.slurm_state not in SLURM_LIVE

    @property
    def running(self) -> bool:
        """A controller beats for a job that has not ended: it can be driven."""
        return not self.ended and self.fresh and not self.slurm_ended

    def word(self) -> str:
        """running | ended | gone | silent (no beat, but SLURM still runs the job)."""
        if self.ended:
            return "ended"
        if self.running:
            return "running"
        if self.slurm_state in SLURM_LIVE:
            return "silent"
        return "gone"

    def describe(self) -> str:
        """One line: the heartbeat and the SLURM job, as known."""
        if self.heartbeat is None:
            beat = "no heartbeat"
        elif self.stopped:
            beat = f"stopped {self.age:.0f}s ago on {self.heartbeat.host}"
        else:
            beat = f"last heartbeat {_ago(self.age)} ago on {self.heartbeat.host}"
        if not self.slurm_job_id:
            return beat
        if self.slurm_state is None:
            slurm = f"SLURM job {self.slurm_job_id}: state unknown ({self.slurm_error})"
        elif self.slurm_state == "":
            slurm = f"SLURM job {self.slurm_job_id}: no longer listed"
        else:
            slurm = f"SLURM job {self.slurm_job_id}: {self.slurm_state}"
        return f"{beat}; {slurm}"


def check(run_dir: Path, state: RunState, *, slurm: bool = True) -> Liveness:
    """The liveness of `run_dir`'s controller. `slurm`: ask squeue too (when the job has a
    SLURM job id and has not ended)."""
    now = time.time()
    heartbeat = read_heartbeat(run_dir)
    age = heartbeat.age(now) if heartbeat is not None else None
    fresh = heartbeat is not None and heartbeat.fresh(now)
    job_id = str(state.job.get("slurm_job_id") or "") or None
    slurm_state = error = None
    if slurm and job_id and not state.ended:
        slurm_state, error = slurm_job_state(job_id)
    return Liveness(
        ended=state.ended,
        heartbeat=heartbeat,
        age=age,
        slurm_job_id=job_id,
        slurm_state=slurm_state,
        slurm_error=error,
        fresh=fresh,
    )


def slurm_job_state(job_id: str) -> tuple[str | None, str | None]:
    """(squeue's state of `job_id`, or "" when it is not listed; None and why when SLURM
    cannot be asked)."""
    if shutil.which("squeue") is None:
        return None, "squeue is not installed here"
    try:
        done = subprocess.run(
            squeue_state_argv(job_id),
            capture_output=True,
            text=True,
            timeout=SQUEUE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    words = done.stdout.split()
    if done.returncode == 0:
        return (words[0] if words else ""), None
    if "Invalid job id" in done.stderr:  # purged from slurmctld's memory: long over
        return "", None
    return None, (done.stderr.strip() or f"squeue exited {done.returncode}")


def _ago(age: float | None) -> str:
    if age is None:
        return "?"
    return f"{age:.1f}s" if age < 10 else f"{age:.0f}s"
