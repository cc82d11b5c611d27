"""What the TUI of `srtr up` does when the job running in it ends (pure, no Textual).

The final state stays on screen for `exit_after` seconds and the App exits with the job's
code; a key pressed during that time, or in the READING_WINDOW seconds before the end, keeps
it open until `q`: the user is reading. Keys that were the teardown the user asked for do
not count as reading: the end is what they were waiting for. The App exits at once when the
user already chose to quit, or when the terminal is gone (a hang-up ended the job: there is
nobody to show it to).
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass

READING_WINDOW = 5.0  # a key pressed this recently before the job ended means "reading"
HANGUP_CODE = 128 + signal.SIGHUP


def job_code(task: asyncio.Task[int]) -> int | None:
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
    return JobEnd(
        exit_now=False,
        banner=f"job ended (exit {code}) · closing in {exit_after:g}s, any key keeps it open",
        close_after=exit_after,
    )
