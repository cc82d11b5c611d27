"""`srtr wait RUN_DIR [--timeout S]`: block until the job ends; exit with its code.

What a CI script needs after `srtr up` in the background or `srtr submit`. A reader of the run dir,
as `srtr status` is, so it works from any host that sees it: it watches state.json
(inotify where the kernel sees the writes, and one stat a second for a shared file system
whose writes come from another host), never the controller's pid.

It prints the job's end (phase, exit code, reason) and, for a failed job, its first failure
with the last lines of that attempt's log (`store.cause_block`). Exit codes: the job's;
124 when `--timeout` passed first (as timeout(1)); 2 for a run dir that is not one; 1 when
the job can never end because its controller died and its guard killed what was left.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli.errors import bad

if TYPE_CHECKING:
    from srtr.store.rundir import RunState

EXIT_TIMEOUT = 124
# A batch job's run dir (`srtr submit`) has its script before the job starts and writes
# state.json: waiting for it then is waiting for SLURM to start the job.
SUBMITTED_MARK = "submit.sh"
_TICK_MS = 250  # how often state.json is compared without an event, and the deadline checked


def add_verbs(verbs: Any) -> None:
    wait = verbs.add_parser(
        "wait", help="wait until a run's job ends; exit with its exit code (124 on timeout)"
    )
    wait.add_argument("run_dir", metavar="RUN_DIR")
    wait.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help="give up after S seconds with exit code 124 (default: wait for ever)",
    )
    wait.set_defaults(func=cmd_wait)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a finite number of seconds, at least 0")
    return value


def cmd_wait(args: argparse.Namespace) -> int:
    from srtr.cli.run_state import read_run

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise bad(str(run_dir), "no such run dir")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    pending = not (run_dir / "state.json").exists() and (run_dir / SUBMITTED_MARK).exists()
    for _ in _changes(run_dir, deadline):
        if pending and not (run_dir / "state.json").exists():
            continue  # a submitted job that has not started yet
        state = read_run(run_dir)
        if state.ended:
            return _report(run_dir, state)
        doomed = _doomed(run_dir, state)
        if doomed:
            print(f"srtr wait: {run_dir}: {doomed}; the job will never end", file=sys.stderr)
            return 1
    state_text = "not started" if pending else f"phase {_phase(run_dir)}"
    print(
        f"srtr wait: {run_dir}: the job did not end within {args.timeout:g}s ({state_text})",
        file=sys.stderr,
    )
    return EXIT_TIMEOUT


def _report(run_dir: Path, state: RunState) -> int:
    """Print the ended job's reason (and first failure); its exit code."""
    from srtr.store.cause_block import block, job_cause

    job = state.job
    code = job.get("exit_code")
    if not isinstance(code, int):
        code = 0 if job.get("phase") == "Succeeded" else 1
    print(f"{job.get('name', '?')}: {job.get('phase')}, exit code {code}: {job.get('reason', '')}")
    if code != 0:
        for line in block(run_dir, job_cause(state)):
            print(line)
    return code


def _doomed(run_dir: Path, state: RunState) -> str | None:
    """Why a job that has not ended never will (its guard killed it), or None."""
    from srtr.cli.crash import beating_heartbeat, killed_by_guard

    if beating_heartbeat(run_dir) is not None:
        return None
    return killed_by_guard(run_dir, state)


def _phase(run_dir: Path) -> str:
    from srtr.store.rundir import StateFileError, read_state

    try:
        return str(read_state(run_dir).job.get("phase", "?"))
    except StateFileError:
        return "unknown"


def _changes(run_dir: Path, deadline: float | None) -> Iterator[None]:
    """Yield once at once, then whenever state.json may have changed, until `deadline`.

    inotify (watchfiles) wakes it at once for writes on this kernel; each quarter second
    without an event it compares state.json's inode, mtime and size with the last ones (a
    write from another host on a shared file system raises no event here)."""
    import watchfiles

    from srtr.store.rundir import STATE_FILES, state_version

    def version() -> object:
        return state_version(run_dir)  # state.json, and a big job's delta log

    seen = version()
    yield
    # state.json is replaced by rename: watch the directory, filter on the names.
    for changes in watchfiles.watch(
        run_dir,
        watch_filter=lambda _, path: Path(path).name in STATE_FILES,
        recursive=False,
        debounce=50,
        rust_timeout=_TICK_MS,
        yield_on_timeout=True,
    ):
        if deadline is not None and time.monotonic() >= deadline:
            return
        now = version()
        if changes or now != seen:
            seen = now
            yield
