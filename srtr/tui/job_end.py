"""What the TUI of `srtr up` does when the job running in it ends (pure, no Textual).

The final state stays on screen for `exit_after` seconds (the banner counts them down) and
the App exits with the job's code; a key pressed during that time, or in the READING_WINDOW
seconds before the end, keeps it open until `q`: the user is reading. Keys that were the
teardown the user asked for do not count as reading: the end is what they were waiting
for. The App exits at once when the user already chose to quit, or when the terminal is
gone (a hang-up ended the job: there is nobody to show it to). Once the terminal is back,
`srtr up` prints what a headless `srtr up` ends with (`summary_lines`): the job's last
event (its reason and exit code), a failed job's first failure with its log tail, and the
run dir, so the end is not lost with the screen.
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from srtr.runtime.progress import REASON_WIDTH
from srtr.store.cause_block import block, job_cause
from srtr.store.rundir import EVENTS_FILE, StateFileError, parse_event, read_state

READING_WINDOW = 5.0  # a key pressed this recently before the job ended means "reading"
HANGUP_CODE = 128 + signal.SIGHUP


def job_code(task: asyncio.Future[int]) -> int | None:
    """The ended job's exit code: 1 when it was cancelled, None when it raised (the App
    exits 1 and `run_with_tui` re-raises the exception once the terminal is back)."""
    if task.cancelled():
        return 1
    if task.exception() is not None:
        return None
    return task.result()


@dataclass(frozen=True, slots=True)
class JobEnd:
    """The App's next step: exit now, or show `banner` (and exit after `close_after` s)."""

    exit_now: bool
    banner: str = ""
    close_after: float | None = None


def ended_banner(code: int) -> str:
    return f"job ended (exit {code}) · q quits"


def closing_banner(code: int, left: float) -> str:
    """The countdown's banner, `left` seconds before the App closes (whole seconds, up)."""
    seconds = math.ceil(max(0.0, left))
    return f"job ended (exit {code}) · closing in {seconds:d}s, any key keeps it open"


JOB_END_REASONS = ("JobSucceeded", "JobFailed")


def summary_lines(run_dir: Path) -> list[str]:
    """What headless `srtr up` ends with: the job's last event, as its progress line, and
    the run dir. Read from events.jsonl, which has every event the TUI showed."""
    last = None
    try:
        with (run_dir / EVENTS_FILE).open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if '"Job' not in line:
                    continue  # most lines are instance events: skip the JSON parse
                event = parse_event(line)
                if event is not None and event.get("reason") in JOB_END_REASONS:
                    last = event
    except OSError:
        pass
    lines = []
    if last is not None:
        stamp = time.strftime("%H:%M:%S", time.localtime(float(last.get("ts") or 0)))
        reason = f"{last['reason']:<{REASON_WIDTH}}"
        lines.append(f"{stamp} {reason} {last['object']}: {last['message']}")
    lines.extend(_failure_lines(run_dir))
    lines.append(f"run dir: {run_dir}  (srtr status {run_dir})")
    return lines


def on_job_end(
    code: int,
    *,
    quit_when_done: bool,
    terminal_gone: bool,
    teardown_sent: bool,
    since_last_key: float,
    exit_after: float,
) -> JobEnd:
    """Exit at once, keep the App open for a reader, or close it after `exit_after` s.

    Args:
        code: the job's exit code.
        quit_when_done: the user asked to quit (and tear down) before the end.
        terminal_gone: the terminal hung up or stopped taking output.
        teardown_sent: the user asked for the teardown (or a kill) that ended the job.
        since_last_key: seconds since the user last pressed a key.
        exit_after: how long the final state stays on screen.
    """
    if quit_when_done or terminal_gone or code == HANGUP_CODE:
        return JobEnd(exit_now=True)
    if since_last_key < READING_WINDOW and not teardown_sent:
        return JobEnd(exit_now=False, banner=ended_banner(code))
    return JobEnd(exit_now=False, banner=closing_banner(code, exit_after), close_after=exit_after)


def _failure_lines(run_dir: Path) -> list[str]:
    """A failed job's first failure and its log tail, as a headless `srtr up` prints them."""
    try:
        state = read_state(run_dir)
    except StateFileError:
        return []
    if not state.job.get("exit_code"):
        return []
    return block(run_dir, job_cause(state))
