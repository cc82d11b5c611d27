"""Where a new run goes, for `up` and `submit`: their --run-dir, --reuse-run-dir and SLURM
flags, and the refusal of a run dir that another run holds.

Imports stay light at module level: every verb builds these parsers.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from srtr.cli.errors import bad
from srtr.runtime.run_dir_setup import PREVIOUS_RUNS

if TYPE_CHECKING:
    from srtr.runtime.request import SlurmFlags
    from srtr.store.rundir import RunState


def add_reuse(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reuse-run-dir",
        action="store_true",
        help=f"a --run-dir that holds an ended run: move its files into {PREVIOUS_RUNS}/N "
        "and start a new run there (without it, such a run dir is refused)",
    )


def add_slurm_flags(parser: argparse.ArgumentParser, help_text: str) -> None:
    """--partition, --account and --time; `help_text` names the flag's meaning as {what}."""
    for flag, what in (
        ("--partition", "partition"),
        ("--account", "account"),
        ("--time", "time limit"),
    ):
        parser.add_argument(
            flag, metavar=what.upper().replace(" ", "_"), help=help_text.format(what=what)
        )


def slurm_flags(args: argparse.Namespace) -> SlurmFlags:
    from srtr.runtime.request import SlurmFlags

    return SlurmFlags(args.partition, args.account, args.time)


def run_dir_path(args: argparse.Namespace, name: str) -> Path:
    """The run dir a new run of the job `name` will use, refused when another run has it
    (unless --reuse-run-dir and that run ended); not created yet."""
    from srtr.cli.run_state import read_run
    from srtr.store.rundir import STATE_FILE

    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        run_dir = Path("outputs") / f"{name}-{stamp}"
    if (run_dir / STATE_FILE).exists():
        state = read_run(run_dir)
        running = None if state.ended else controller_running(run_dir)
        if running:
            raise bad("--run-dir", f"{run_dir} belongs to a running job ({running})")
        if not getattr(args, "reuse_run_dir", False):
            # Two runs in one dir would mix: a second Started, the old logs appended to,
            # the old recipe overwritten.
            raise bad(
                "--run-dir",
                f"{run_dir} holds another run ({_run_summary(run_dir, state)}); give another "
                f"--run-dir, or --reuse-run-dir to move its files aside into "
                f"{run_dir / PREVIOUS_RUNS}/",
            )
    return run_dir


def controller_running(run_dir: Path) -> str | None:
    """How a controller of `run_dir` is known to run (for the refusal), or None."""
    from srtr.cli.crash import beating_heartbeat

    heartbeat = beating_heartbeat(run_dir)
    if heartbeat is None:
        return None
    return f"its controller, pid {heartbeat.pid} on {heartbeat.host}, beats"


def _run_summary(run_dir: Path, state: RunState) -> str:
    from srtr.cli.crash import killed_by_guard

    job = state.job
    killed = killed_by_guard(run_dir, state)
    if killed is not None:
        return f"job {job.get('name')}: {killed}"
    ended = job.get("ended_at")
    when = f" at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ended))}" if ended else ""
    return f"job {job.get('name')}, {state.phase}{when}, exit code {job.get('exit_code')}"
