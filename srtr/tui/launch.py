"""The two ways into the TUI, which the CLI calls: `srtr up` on a terminal (`run_with_tui`)
and `srtr tui RUN_DIR` (`attach`).

- In `srtr up` the job runs in the App's event loop (see `job_end.py` for what the App does
  when it ends). Quitting while the job runs asks to tear it down (the job cannot outlive
  its TUI), and if the TUI dies the job is torn down before `srtr up` returns.
- `srtr tui RUN_DIR` refuses (exit 2) a run whose job has ended or whose controller is
  dead: use `srtr status` / `srtr logs` for those. A job that ends while attached stays on
  screen, read-only, until `q`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from srtr.reconciler.rundir import StateFileError, read_state
from srtr.runtime.control import ControlError, send
from srtr.tui import job_end
from srtr.tui.app import SrtrApp

EXIT_GONE = 2


def run_with_tui(run_dir: Path, job: Coroutine[Any, Any, int]) -> int:
    """`srtr up` on a terminal: run the job and the TUI in one event loop; the job's code."""
    return asyncio.run(_up(run_dir, job))


async def _up(run_dir: Path, job: Coroutine[Any, Any, int]) -> int:
    task = asyncio.create_task(job)
    app = SrtrApp(run_dir, job=task)
    try:
        await app.run_async()
    finally:
        if not task.done():
            # The TUI closed (or crashed) while the job runs: never orphan instances.
            print("srtr: the TUI closed while the job runs; tearing it down", file=sys.stderr)
            with contextlib.suppress(ControlError):
                await asyncio.to_thread(send, run_dir, "teardown")
    code = await task
    if not app.terminal_gone:
        # The screen is gone: say on the terminal what a headless `srtr up` ends with.
        for line in job_end.summary_lines(run_dir):
            print(line, flush=True)
    return code


def attach(run_dir: Path) -> int:
    """`srtr tui RUN_DIR`: watch and drive a running job; 2 when the job is gone."""
    try:
        state = read_state(run_dir)
    except StateFileError as exc:
        print(f"srtr tui: cannot read {exc.path}: {exc}", file=sys.stderr)
        return EXIT_GONE
    job = state.job
    if state.ended:
        print(
            f"srtr tui: the job of {run_dir} has ended ({job.get('phase')}, exit code "
            f"{job.get('exit_code')}); see `srtr status {run_dir}` and `srtr logs`",
            file=sys.stderr,
        )
        return EXIT_GONE
    if not state.controller_alive():
        print(
            f"srtr tui: the controller of {run_dir} (pid {job.get('controller_pid')}) is not "
            f"running; its last state: phase {job.get('phase')}. See `srtr status {run_dir}`",
            file=sys.stderr,
        )
        return EXIT_GONE
    result = SrtrApp(run_dir).run()
    return 0 if result is None else result
