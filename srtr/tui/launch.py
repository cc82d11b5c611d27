"""The two ways into the TUI, which the CLI calls: `srtr up` on a terminal (`run_with_tui`)
and `srtr tui RUN_DIR` (`attach`).

- In `srtr up` the job runs in the App's event loop (see `job_end.py` for what the App does
  when it ends). Quitting while the job runs asks to tear it down, and if the TUI dies the
  job is torn down before `srtr up` returns. Detaching (`d`) closes the TUI and leaves the
  job running headless in the background (`srtr.runtime.detach`); `srtr tui` re-attaches.
- `srtr tui RUN_DIR` on a run whose job has ended, or whose controller is dead, opens it
  read-only for the post-mortem: the last state, the events and every log, and no
  intents. A job that ends while attached stays on screen the same way, until `q`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from srtr.runtime import detach
from srtr.runtime.control import ControlError, send
from srtr.store.rundir import RunState, StateFileError
from srtr.tui import job_end
from srtr.tui.app import SrtrApp
from srtr.tui.source import RunSource

EXIT_GONE = 2


def run_with_tui(run_dir: Path, job: Coroutine[Any, Any, int], *, theme: str | None = None) -> int:
    """`srtr up` on a terminal: run the job and the TUI in one event loop; the job's code."""
    return asyncio.run(_up(run_dir, job, theme))


async def _up(run_dir: Path, job: Coroutine[Any, Any, int], theme: str | None) -> int:
    task = asyncio.create_task(job)
    app = SrtrApp(run_dir, job=task, theme_name=theme)
    try:
        await app.run_async()
    finally:
        if not task.done() and not app.detached:
            # The TUI closed (or crashed) while the job runs: never orphan instances.
            print("srtr: the TUI closed while the job runs; tearing it down", file=sys.stderr)
            with contextlib.suppress(ControlError):
                await asyncio.to_thread(send, run_dir, "teardown")
    if app.detached and not task.done():
        _detach(run_dir)
        return await task  # headless now: nothing more for the terminal
    code = await task
    if not app.terminal_gone:
        # The screen is gone: say on the terminal what a headless `srtr up` ends with.
        for line in job_end.summary_lines(run_dir):
            print(line, flush=True)
    return code


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
