"""The cause block: what `srtr status`, `srtr wait` and `srtr up` print of a job's first
failure (state.json `job.cause`): its one line, then the last lines of that attempt's log.

The attempt's output starts at the cause's `log_offset` in the instance's log and ends where
the next attempt's restart marker is (`rundir.restart_marker`), or at the end of the file:
restarts that followed do not push the first crash's last words out of view.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

from srtr.store import causes
from srtr.store.rundir import CauseDoc, RunState, parse_restart_marker
from srtr.store.status import JobStatus

TAIL_LINES = 10
# How much of the attempt's log is read at most (from its start): a log of gigabytes is not
# read whole for ten lines.
_MAX_READ = 4 << 20


def job_cause(state: RunState) -> CauseDoc | None:
    """The job's first failure, if state.json has one (older writers had none)."""
    cause = state.doc["job"].get("cause")
    return cause if isinstance(cause, dict) and cause.get("instance") else None


def attempt_tail(run_dir: Path, cause: CauseDoc, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines the failed attempt wrote; [] when its log cannot be read."""
    path = run_dir / str(cause.get("log", ""))
    start = int(cause.get("log_offset") or 0)
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(start)
            data = handle.read(min(max(0, size - start), _MAX_READ))
    except OSError:
        return []
    tail: deque[str] = deque(maxlen=lines)
    for raw in data.decode(errors="replace").splitlines():
        if parse_restart_marker(raw) is not None:
            break  # the next attempt starts here
        tail.append(raw)
    return list(tail)


def block(run_dir: Path, cause: CauseDoc | None, lines: int = TAIL_LINES) -> list[str]:
    """`first failure: <summary>` and the attempt's log tail, indented; [] without a cause."""
    if cause is None:
        return []
    text = [f"first failure: {cause.get('summary') or cause['instance']}"]
    tail = attempt_tail(run_dir, cause, lines)
    if tail:
        text.append(f"last {len(tail)} line(s) of {cause['log']} (attempt {cause['attempt']}):")
        text.extend(f"  | {line}" for line in tail)
    return text


def failed_job_block(run_dir: Path, job: JobStatus) -> list[str]:
    """A failed job's first failure and its log tail, for the last lines of `srtr up`; []
    for a job that did not fail (its cause, if any, was healed by a restart)."""
    if not job.exit_code or job.cause is None:
        return []
    return block(run_dir, causes.cause_doc(job.cause))
