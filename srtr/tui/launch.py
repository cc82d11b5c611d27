"""The two ways into the TUI, which the CLI calls: `srtr up` on a terminal (`run_with_tui`)
and `srtr tui RUN_DIR` (`attach`).

- In `srtr up` the job runs in the `srtr up` process, headless, and the TUI in a process
  of its own on the same terminal (`up_process.py`; `job_end.py` says what the TUI does
  when the job ends). Quitting while the job runs asks to tear it down, and if the TUI
  dies the job is torn down before `srtr up` returns. Detaching (`d`) closes the TUI and leaves the
  job running headless in the background (`srtr.runtime.detach`); `srtr tui` re-attaches.
- `srtr tui RUN_DIR` on a run whose job has ended, or whose controller is dead, opens it
  read-only for the post-mortem: the last state, the events and every log, and no
  intents. A job that ends while attached stays on screen the same way, until `q`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from srtr.runtime import detach
from srtr.runtime.control import ControlError, send
from srtr.runtime.progress import detach_terminal
from srtr.runtime.request import PlanWatcher
from srtr.store.rundir import RunState, StateFileError
from srtr.tui import job_end, up_process
from srtr.tui.source import RunSource

# The App (Textual: a third of a second of imports) is imported where it runs, in the TUI's
# process: the controller of `srtr up` runs none of it. Whether it is installed is known here.
if importlib.util.find_spec("textual") is None:
    raise ImportError("No module named 'textual'")

EXIT_GONE = 2
Job = Coroutine[Any, Any, int]


def run_with_tui(
    run_dir: Path, make_job: Callable[[PlanWatcher], Job], *, theme: str | None = None
) -> int:
    """`srtr up` on a terminal: the job runs here, headless, and the TUI in a process of its
    own on the same terminal (`up_process`), started as the job starts planning
    (`make_job` plans it, and tells the watcher it is given), at the latest before the
    job runs; the job's code."""
    tui = up_process.UpTui(run_dir, theme)
    try:
        job = make_job(tui)
    except BaseException:
        tui.abandon()  # the terminal as it was, for the error that follows
        raise
    try:
        tui.start()
    except BaseException:
        job.close()
        raise
    assert tui.proc is not None
    return asyncio.run(_up(run_dir, job, tui.proc, tui.write))


async def _up(
    run_dir: Path, job: Coroutine[Any, Any, int], tui: subprocess.Popen[bytes], write: int
) -> int:
    task = asyncio.create_task(job)
    closed = asyncio.ensure_future(up_process.exited(tui))
    await asyncio.wait((task, closed), return_when=asyncio.FIRST_COMPLETED)
    if closed.done() and not task.done():
        status = closed.result()
        if status == up_process.DETACHED:
            os.close(write)
            _detach(run_dir)
            return await task  # headless now: nothing more for the terminal
        if up_process.hung_up(status):
            detach_terminal()
            up_process.hang_up()  # the runner's handler: teardown, exit 129
        else:
            # The TUI closed (or crashed) while the job runs: never orphan instances.
            print("srtr: the TUI closed while the job runs; tearing it down", file=sys.stderr)
            with contextlib.suppress(ControlError):
                await asyncio.to_thread(send, run_dir, "teardown")
    await asyncio.wait((task,))
    # The job is over: a hang-up (the kernel's, as the terminal closes) has nothing to end.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    up_process.tell(write, task)  # the TUI shows the end, then closes
    gone = up_process.hung_up(await closed)
    if gone:
        detach_terminal()  # nobody to print to, and nothing may block on a dead terminal
    code = task.result()  # a job that raised raises here, once the terminal is back
    if not gone:
        # The screen is gone: say on the terminal what a headless `srtr up` ends with.
        for line in job_end.summary_lines(run_dir):
            print(line, flush=True)
    return code


def follow_up(run_dir: Path, read: int, *, theme: str | None = None) -> int:
    """The TUI of `srtr up` (`srtr tui` with the private flag `up_process.start` gives):
    `read` brings the job's outcome. The exit status says how the TUI ended."""
    # Ctrl+C is the TUI's key; a SIGINT from the terminal (before the TUI has it, or after)
    # is for the controller, which tears down as headless `srtr up` does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return asyncio.run(_follow_up(run_dir, read, theme))


async def _follow_up(run_dir: Path, read: int, theme: str | None) -> int:
    plan: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    job = up_process.outcome(read, plan)
    from srtr.tui.app import SrtrApp

    # The job before its view, once the first frame is up: on a busy host the controller
    # and its nodes get the CPU first, and the TUI what they leave (it lags; it never slows
    # the job): its own thread and its reading threads alike.
    app = SrtrApp(run_dir, job=job, plan=plan, theme_name=theme, nice=up_process.NICE)
    await app.run_async()
    if app.detached:
        return up_process.DETACHED
    return up_process.GONE if app.terminal_gone else 0


def _detach(run_dir: Path) -> None:
    """`d` in the TUI: the job goes on headless, in the background (`runtime.detach`)."""
    for line in detach_lines(run_dir, os.getpid()):
        print(line)
    sys.stdout.flush()
    detach.go_headless(run_dir / "logs" / "srtr.log")
    detach.to_background()


def detach_lines(run_dir: Path, pid: int) -> list[str]:
    return [
        f"srtr: detached; the job goes on in the background, headless (pid {pid}).",
        f"  re-attach:  srtr tui {run_dir}",
        f"  follow it:  srtr status {run_dir}  ·  {run_dir / 'logs' / 'srtr.log'}",
        f"  stop it:    srtr down {run_dir}",
        "  This terminal may be closed: the job does not end with it. (A shell may say",
        "  'Stopped' for a moment: `jobs` then shows it Running, in the background.)",
    ]


def attach(
    run_dir: Path,
    *,
    theme: str | None = None,
    source: RunSource | None = None,
    state: RunState | None = None,
) -> int:
    """`srtr tui RUN_DIR`: watch and drive a running job, or read a finished one (read-only:
    the post-mortem). 2 when the run dir has no readable state.json. `source` and `state`:
    a reader of `run_dir` and the state it read already (the CLI checks the run dir so)."""
    from srtr.tui.app import SrtrApp

    source = source or RunSource(run_dir)
    try:
        # A clear error for a run dir with no readable state.
        state = state or source.first_state()
    except StateFileError as exc:
        print(f"srtr tui: cannot read {exc.path}: {exc}", file=sys.stderr)
        return EXIT_GONE
    # A finished job, or one whose controller is gone, opens read-only: the App sees the
    # same in state.json and offers no intents (its header says why). The snapshot just
    # read is its first frame: a large one is not parsed twice.
    result = SrtrApp(run_dir, theme_name=theme, source=source, state=state).run()
    return 0 if result is None else result
