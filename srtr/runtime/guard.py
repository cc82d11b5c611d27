"""The job's guard: if the controller dies without cleaning up, kill what it left behind.

`srtr up` starts one guard per job (`python -m srtr.runtime.guard RUN_DIR PID WINDOW
[MIRROR_FD] [--slurm-job ID] [--salloc-output FD]`, in its own session so Ctrl+C does not
reach it). It blocks on the controller's pidfd (no polling while the controller lives).
When the controller exits:

- another controller adopted the run dir within WINDOW seconds (`srtr up --adopt`): that
  controller has its own guard, this one leaves. It knows by the successor's heartbeat
  (heartbeat.json: another machine or pid beats), which works whatever host adopted, or by
  its pid in state.json before its first beat (this host only);
- the job ended normally (state.json phase Succeeded/Failed): no instance is killed;
- no state.json was ever written (the controller died while allocating or planning): nobody
  can adopt such a job, so the guard acts at once;
- otherwise: SIGKILL every recorded instance process group whose pid still has the recorded
  kernel start time. So instances outlive a crashed controller by at most WINDOW seconds,
  which is the adoption window. Instances under node agents (identity marked `agent`) are
  their agents' to stop: an agent waits the same window.

What it sees goes into the run dir: `guard.json` (`GuardDoc`) and a `ControllerLost` event
when the controller dies without ending the job, and a `GuardKilled` event (and guard.json
again) when it killed what nobody adopted, so `srtr status` can tell how long adoption is
possible and `srtr up --adopt` can refuse a job with nothing left.

In every case but adoption it also cancels the SLURM allocation srtr made: the one named by
`--slurm-job`, the one salloc named in `--salloc-output` and the one the state records as
owned (scancel of a released job is a no-op), and every grow job the state records as
pending or granted (a grow job also ends by itself once the main job is gone).
`srtr up` starts the guard before salloc, with salloc's stderr going to a memfd the guard
holds (`--salloc-output`): whenever the controller dies, pending or granted, the guard finds
the job salloc asked for, even if the controller never read salloc's answer.

The controller also mirrors every state.json it writes into a memfd the guard holds
(`StateMirror`): a run dir removed right after a kill -9 (a purged scratch dir) would
otherwise leave the guard only its last periodic read, which can predate the newest launches.
For a big job the mirror holds what the run dir does: the snapshot, then each delta line
appended (`srtr.store.state_delta`), read back the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from srtr.backends.procgroup import process_start_time
from srtr.backends.slurm.cmd import (
    parse_salloc_job_id,
    parse_salloc_pending_job_id,
    scancel_job_argv,
)
from srtr.store.rundir import (
    EVENTS_FILE,
    GUARD_FILE,
    STATE_FILE,
    EventDoc,
    GuardDoc,
    RunState,
    StateFileError,
    pid_alive,
    read_heartbeat,
    read_state,
    state_version,
)
from srtr.store.state_delta import apply_deltas, snapshot_seq

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

    def append(self, text: str) -> None:
        """One delta line after what is there (a torn last line is ignored by readers)."""
        os.pwrite(self.fd, text.encode(), os.fstat(self.fd).st_size)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _read_mirror(fd: int, run_dir: Path) -> RunState | None:
    """The mirror's state: its first line, and the delta lines after it for a big job."""
    try:
        size = os.fstat(fd).st_size
        first, _, rest = os.pread(fd, size, 0).partition(b"\n") if size else (b"", b"", b"")
        doc = json.loads(first) if first else None
        state = RunState.from_doc(doc, run_dir / STATE_FILE) if doc is not None else None
    except (OSError, ValueError, StateFileError):
        return None
    seq = snapshot_seq(doc) if isinstance(doc, dict) else None
    if isinstance(doc, dict) and seq is not None:
        apply_deltas(doc, seq, rest.splitlines())
    return state


class _LastState:
    """The newest state the guard could read, kept in memory: the controller's mirror when it
    has one (always current), else state.json."""

    def __init__(self, run_dir: Path, mirror_fd: int | None = None) -> None:
        self.run_dir = run_dir
        self.mirror_fd = mirror_fd
        self.state: RunState | None = None
        self._stamp: object = None

    def refresh(self) -> RunState | None:
        if self.mirror_fd is not None:
            mirrored = _read_mirror(self.mirror_fd, self.run_dir)
            if mirrored is not None:
                self.state = mirrored
                return mirrored
        stamp = state_version(self.run_dir)  # state.json and a big job's delta log
        if stamp[0] is None:
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
    return killed


def salloc_job(fd: int | None) -> str | None:
    """The job salloc named (granted or pending) in the memfd that took its stderr."""
    if fd is None:
        return None
    try:
        text = os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
    except OSError:
        return None
    return parse_salloc_job_id(text) or parse_salloc_pending_job_id(text)


def owned_allocations(state: RunState | None, controller: int, *named: str | None) -> list[str]:
    """The SLURM jobs srtr made for this job: those `named` (argv, salloc) and the state's.

    An ended state written by another controller (an old job's state.json in a reused run
    dir) says nothing about ours: its allocation was released long ago, and its job id may
    have been given to someone else's job since (a restarted cluster counts from 1 again).
    """
    jobs = [job for job in named if job]
    if state is None or (state.ended and state.controller_pid != controller):
        return jobs
    job = state.job
    if job.get("backend") == "slurm" and job.get("slurm_job_id") and job.get("owns_allocation"):
        jobs.append(str(job["slurm_job_id"]))
    jobs += grow_jobs(state)
    return list(dict.fromkeys(jobs))


def grow_jobs(state: RunState) -> list[str]:
    """The run's SLURM grow jobs that still hold or wait for nodes (state.json `grow`):
    whether or not srtr made the main allocation, they are srtr's own."""
    grow = state.doc.get("grow")
    if not isinstance(grow, dict) or grow.get("provider") != "SLURM":
        return []
    return [
        str(r["id"])
        for r in grow.get("requests", [])
        if isinstance(r, dict) and r.get("phase") in ("Pending", "Granted")
    ]


def release_allocations(jobs: list[str]) -> None:
    for job_id in jobs:
        # One try, no retries: the guard is a tiny process that must not linger.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(scancel_job_argv(job_id), check=False, capture_output=True, timeout=60)


def guard(
    run_dir: Path,
    controller: int,
    window: float,
    mirror_fd: int | None = None,
    slurm_job: str | None = None,
    salloc_fd: int | None = None,
) -> int:
    last = _LastState(run_dir, mirror_fd)
    if mirror_fd is None:
        last.refresh()  # with a mirror, reading once after the controller exits is enough
    wait_exit(controller, None if mirror_fd is not None else last)
    last.refresh()
    record = _lost(run_dir, controller, window, last.state)
    adopted, state = _wait_for_adoption(run_dir, controller, window, last)
    if adopted:
        return 0
    killed = reap_orphans(state) if state is not None and not state.ended else 0
    if record is not None and state is not None and not state.ended:
        _killed(run_dir, record, killed, state)
    jobs = owned_allocations(state, controller, slurm_job, salloc_job(salloc_fd))
    release_allocations(jobs)
    released = f"; cancelled SLURM job {', '.join(jobs)}" if jobs else ""
    if state is None and jobs:
        _note(run_dir, f"guard: controller {controller} ended before any state.json{released}")
    elif state is not None and not state.ended:
        _note(
            run_dir,
            f"guard: controller {controller} died and nobody adopted the job within "
            f"{window:g}s; killed {killed} instance group(s){released}",
        )
    return 0


def _lost(run_dir: Path, controller: int, window: float, state: RunState | None) -> GuardDoc | None:
    """The controller died without ending the job: say so in the run dir (guard.json and a
    ControllerLost event), with how long `srtr up --adopt` may take the job over."""
    if state is None or state.ended or not run_dir.exists():
        return None
    now = time.time()
    record: GuardDoc = {
        "controller_pid": controller,
        "lost_at": now,
        "adopt_until": now + window,
        "killed_at": None,
        "killed": 0,
    }
    _write_guard(run_dir, record)
    _event(
        run_dir,
        state,
        "ControllerLost",
        f"controller pid {controller} died without ending the job; adopt it with "
        f"`srtr up --adopt {run_dir}` within {window:g}s, or its guard kills every instance",
    )
    return record


def _killed(run_dir: Path, record: GuardDoc, killed: int, state: RunState) -> None:
    record = {**record, "killed_at": time.time(), "killed": killed}
    _write_guard(run_dir, record)
    _event(
        run_dir,
        state,
        "GuardKilled",
        f"nobody adopted the job within the adoption window: killed {killed} instance "
        f"group(s) of controller pid {record['controller_pid']}; the job is over",
    )


def _write_guard(run_dir: Path, record: GuardDoc) -> None:
    """guard.json, atomically (a reader sees the old record or the new one)."""
    with contextlib.suppress(OSError):
        tmp = run_dir / f".{GUARD_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, run_dir / GUARD_FILE)


def _event(run_dir: Path, state: RunState, reason: str, message: str) -> None:
    """Append one warning to events.jsonl, as the controller would have (one write, so a
    reader never sees half a line)."""
    event: EventDoc = {
        "ts": round(time.time(), 3),
        "type": "Warning",
        "reason": reason,
        "object": "job",
        "message": message,
        "generation": int(state.job.get("generation") or 1),
    }
    line = (json.dumps(event) + "\n").encode()
    with contextlib.suppress(OSError):
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW  # a planted link: no
        fd = os.open(run_dir / EVENTS_FILE, flags, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _note(run_dir: Path, line: str) -> None:
    with (
        contextlib.suppress(OSError),
        open(run_dir / "logs" / "srtr.log", "a", encoding="utf-8") as log,
    ):
        log.write(line + "\n")


def _wait_for_adoption(
    run_dir: Path, controller: int, window: float, last: _LastState
) -> tuple[bool, RunState | None]:
    """(adopted, the state to act on): adopted when a successor took the job over in time.

    A run dir that vanished cannot be adopted (`srtr up --adopt` needs it), nor can one whose
    controller died before it wrote a state.json: the last state the guard read (or None) is
    acted on at once, so nothing of the job outlives it. Nor can an ended job.
    """
    deadline = time.monotonic() + window
    while True:
        if not run_dir.exists():
            return False, last.state
        # Adoption shows in state.json, which a successor writes (the mirror is ours alone).
        on_disk = _state(run_dir) if last.mirror_fd is not None else last.refresh()
        state = last.state if on_disk is None else on_disk
        if state is None:
            return False, None
        if state.ended or (last.state is not None and last.state.ended):
            return False, state if state.ended else last.state
        if _successor_beats(run_dir, controller):
            return True, None  # adopted: the new controller runs its own guard
        successor = state.controller_pid
        if successor and successor != controller and pid_alive(successor):
            return True, None  # the same, seen by pid before its first beat
        if time.monotonic() >= deadline:
            return False, last.state
        time.sleep(0.5)  # only inside the adoption window, after the controller is gone


def _successor_beats(run_dir: Path, controller: int) -> bool:
    """Another controller beats in the run dir: one that adopted the job, maybe from another
    host (a login node), whose pid means nothing here. Our dead controller's last beat stays
    fresh for a few seconds: it is told apart by its machine and pid."""
    beat = read_heartbeat(run_dir)
    if beat is None or not beat.fresh(time.time()):
        return False
    return not (beat.same_machine() and beat.pid == controller)


@dataclass(frozen=True)
class Started:
    """A running guard and the memory file it reads the controller's state from."""

    process: subprocess.Popen[bytes]
    mirror: StateMirror


def start(
    run_dir: Path,
    window: float = ADOPT_WINDOW,
    mirror: StateMirror | None = None,
    slurm_job: str | None = None,
    salloc_output: int | None = None,
    hold: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start the guard of the calling controller; `slurm_job`: the allocation srtr made;
    `salloc_output`: the memfd salloc writes its stderr to, for one srtr is making; `hold`:
    descriptors the guard keeps open until it exits, unread (the local job's loopback block,
    which must stay the job's as long as its instances may be adopted)."""
    argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(os.getpid()), str(window)]
    fds = [fd for fd in (mirror.fd if mirror else None, salloc_output) if fd is not None]
    fds += hold
    if mirror is not None:
        argv.append(str(mirror.fd))
    if slurm_job is not None:
        argv += ["--slurm-job", slurm_job]
    if salloc_output is not None:
        argv += ["--salloc-output", str(salloc_output)]
    return subprocess.Popen(
        argv,
        pass_fds=fds,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def start_mirrored(
    run_dir: Path,
    window: float,
    slurm_job: str | None = None,
    salloc_output: int | None = None,
    hold: Sequence[int] = (),
) -> Started:
    """A guard with its state mirror, for a controller that starts it before its job runs."""
    mirror = StateMirror()
    return Started(start(run_dir, window, mirror, slurm_job, salloc_output, hold), mirror)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m srtr.runtime.guard")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("controller", type=int)
    parser.add_argument("window", type=float)
    parser.add_argument("mirror_fd", type=int, nargs="?")
    parser.add_argument("--slurm-job")
    parser.add_argument("--salloc-output", type=int)
    args = parser.parse_args(argv)
    return guard(
        args.run_dir,
        args.controller,
        args.window,
        args.mirror_fd,
        args.slurm_job,
        args.salloc_output,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
