"""`srtr up` (also `up --adopt`): its arguments become a `JobRequest`, which
`runtime.assembly` makes a running job of; this module runs it headless or in the TUI.

`submit` is in `submit.py`, the verbs that look at a run dir (status, logs, tui, down) in
`status.py`.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli.errors import StoppedBySignal
from srtr.cli.errors import bad as _bad
from srtr.cli.run_dir import add_reuse, add_slurm_flags, controller_running, run_dir_path
from srtr.cli.run_state import read_run

# The planning verbs' imports (pydantic, the recipe model: 0.1-0.3 s) stay in their functions:
# `srtr status` from a login node must not pay for them (benchmarks/control.py). The run
# dir's (srtr.store) do too: every verb builds this module's parsers, `srtr plan` included.

if TYPE_CHECKING:
    from srtr.runtime.assembly import Job
    from srtr.runtime.request import JobRequest, PlanWatcher
    from srtr.store.rundir import RunState


def _stop_by_signal(signum: int, _frame: object) -> None:
    raise StoppedBySignal(signum)


def _startup_signals() -> None:
    """Until `run_job` takes over, SIGTERM/SIGHUP unwind like Ctrl+C does: an allocation
    srtr asked for is released, and `srtr up` exits 128 + signal instead of dying at once."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_by_signal)


def add_verbs(verbs: Any) -> None:
    """`up`, on the CLI's sub-parsers."""
    _add_up(verbs.add_parser("up", help="run a recipe until its job ends"))


def _add_up(up: argparse.ArgumentParser) -> None:
    up.add_argument("recipe", nargs="?", help="recipe YAML file (optional with --adopt)")
    up.add_argument(
        "--adopt",
        metavar="RUN_DIR",
        help="take over the job of a crashed controller: adopt what still runs, 0 restarts",
    )
    up.add_argument(
        "--adopt-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long instances outlive a crashed controller, waiting to be adopted (60)",
    )
    up.add_argument(
        "--backend",
        choices=("auto", "local", "slurm"),
        default="auto",
        help="where instances run; auto: slurm inside an allocation, local otherwise",
    )
    up.add_argument(
        "--launcher",
        choices=("auto", "process", "step", "agent"),
        default="auto",
        help="how instances start: process (local), step (an srun step each, SLURM), or "
        "agent (a node agent per node starts them); auto: process locally, agent on SLURM "
        "(instances SLURM must set up keep their own step)",
    )
    add_slurm_flags(up, "SLURM {what} when srtr allocates (default: resources.*)")
    up.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="nodes to simulate (local) or to allocate (slurm); default: what the recipe needs",
    )
    up.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where state, events and logs go (default outputs/<name>-<UTC time>)",
    )
    add_reuse(up)
    _add_up_watching(up)
    up.set_defaults(func=cmd_up)


def _add_up_watching(up: argparse.ArgumentParser) -> None:
    """How `up` shows the job, takes live edits and serves its metrics."""
    up.add_argument(
        "--headless",
        action="store_true",
        help="plain progress lines instead of the TUI (the default when stdout is not a terminal)",
    )
    up.add_argument(
        "--theme",
        metavar="NAME",
        help="the TUI's colours: dark (default), light, terminal (its own), or a Textual "
        "theme; default $SRTR_THEME",
    )
    up.add_argument(
        "--apply",
        choices=("auto", "confirm"),
        help="live edits of the recipe: apply at once (default headless) or after a yes "
        "in the TUI (default there)",
    )
    up.add_argument(
        "--watch-poll",
        action="store_true",
        help="poll the recipe file instead of inotify (automatic on NFS, Lustre, GPFS)",
    )
    # Hollow mode, a testing and benchmark tool (docs/agents.md): one process simulates every
    # node's agent and instances. Hidden: it runs nothing of the user's.
    up.add_argument("--hollow", action="store_true", help=argparse.SUPPRESS)
    up.add_argument("--no-watch", action="store_true", help="ignore edits of the recipe file")
    from srtr.runtime.metrics_listen import ListenAction

    up.add_argument(
        "--metrics-port",
        metavar="[HOST:]PORT",
        type=_metrics_listen,
        action=ListenAction,
        help="serve srtr's own Prometheus metrics there (0: a free port; a bare PORT: on "
        "loopback only; the URL is in state.json job.metrics_url)",
    )
    up.add_argument(
        "--metrics-address",
        metavar="HOST",
        action=ListenAction,
        help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0: every one)",
    )


def _metrics_listen(text: str) -> tuple[str, int]:
    from srtr.runtime.metrics_listen import parse_listen

    return parse_listen(text)


def _check_theme(name: str | None) -> None:
    """A bad `--theme` (or SRTR_THEME) for the TUI is an input error: exit 2."""
    try:
        from srtr.tui.themes import ThemeError, resolve
    except ImportError:
        return  # no TUI here: `up` shows progress lines, in no theme
    try:
        resolve(name)
    except ThemeError as exc:
        raise _bad("srtr up", str(exc)) from None


def _tui(args: argparse.Namespace) -> bool:
    """Whether the TUI shows the job: on a terminal unless --headless, if installed."""
    if args.headless or not sys.stdout.isatty():
        return False
    try:
        import srtr.tui.launch  # noqa: F401
    except ImportError:
        print("srtr: the TUI is not available; showing progress lines", file=sys.stderr)
        return False
    return True


def _request(
    args: argparse.Namespace,
    run_dir: Path,
    *,
    tui: bool = False,
    watcher: PlanWatcher | None = None,
) -> JobRequest:
    """The job `up` is asked for; adopting, what the crashed job recorded decides the rest."""
    from srtr.cli.run_dir import slurm_flags
    from srtr.runtime.request import JobRequest

    return JobRequest(
        recipe=args.recipe,
        run_dir=run_dir,
        backend=args.backend,
        launcher=args.launcher,
        nodes=args.nodes,
        slurm=slurm_flags(args),
        adopt_window=args.adopt_window,
        watch=not args.no_watch,
        watch_poll=args.watch_poll,
        apply=args.apply,
        metrics_listen=args.metrics_port,
        hollow=args.hollow,
        tui=tui,
        plan_watcher=watcher,
    )


def cmd_up(args: argparse.Namespace) -> int:
    from srtr.runtime.run_lock import one_line

    _startup_signals()
    if not args.headless and sys.stdout.isatty():
        _check_theme(args.theme)  # before anything starts, as for any bad flag
    with one_line(Path(args.adopt or args.run_dir or ".")):  # adopt: never a traceback
        adopt_from = _crashed_job(args)
        if adopt_from is not None:
            return _adopt(args, adopt_from)
    if args.recipe is None:
        raise _bad("srtr up", "give a RECIPE, or --adopt RUN_DIR")
    # Planning builds what lives as long as the job: the cyclic collector's passes over it
    # free nothing (1.2 s at 80,000 instances). The job turns it on (`gc_freeze.Freezer`).
    gc.disable()
    try:
        return _up(args)
    finally:
        gc.enable()


def _up(args: argparse.Namespace) -> int:
    from srtr.resources.loading import load_text, read_text
    from srtr.runtime.assembly import new_job
    from srtr.runtime.recipe_secrets import warn_if_exposed

    text = read_text(args.recipe)
    recipe = load_text(text, args.recipe)
    warn_if_exposed(Path(args.recipe), recipe)  # secrets in a file others can read
    if args.nodes is not None and args.nodes < 1:
        raise _bad("--nodes", "must be at least 1")
    run_dir = run_dir_path(args, recipe.name)
    if _tui(args):
        from srtr.tui.launch import run_with_tui

        # The TUI starts as the job plans, and shows the plan until the first state.json.
        def make(watcher: PlanWatcher) -> Job:
            return new_job(_request(args, run_dir, tui=True, watcher=watcher), text, recipe)

        return run_with_tui(run_dir, make, theme=args.theme)
    import asyncio

    return asyncio.run(new_job(_request(args, run_dir), text, recipe))


def _crashed_job(args: argparse.Namespace) -> RunState | None:
    """The state of a job whose controller died, when `up` is asked to take it over.

    `--adopt RUN_DIR` asks explicitly; `--run-dir DIR` of such a job implies it.
    """
    from srtr.cli.crash import killed_by_guard
    from srtr.store.rundir import STATE_FILE

    where = args.adopt or args.run_dir
    if not where or not (Path(where) / STATE_FILE).exists():
        if args.adopt:
            raise _bad(args.adopt, "no state.json here; nothing to adopt")
        return None
    state = read_run(Path(where))
    if state.ended:
        if args.adopt:
            raise _bad(args.adopt, f"the job has ended ({state.phase}); nothing to adopt")
        return None
    killed = killed_by_guard(Path(where), state)
    if killed is not None:
        # Refused rather than relaunched: adoption takes over what still runs, with its
        # restart counts and passed stages; a job with nothing left is a new run, which
        # --reuse-run-dir starts cleanly (the old files kept aside).
        if args.adopt:
            raise _bad(
                args.adopt,
                f"{killed}; nothing to adopt. Start it again with "
                f"`srtr up RECIPE --run-dir {args.adopt} --reuse-run-dir`",
            )
        return None
    running = controller_running(Path(where))
    if running:
        raise _bad(str(where), f"belongs to a running job ({running})")
    return state


def _adopt(args: argparse.Namespace, state: RunState) -> int:
    """Take over the crashed job in `state`; always headless (progress lines)."""
    import asyncio

    from srtr.runtime.assembly import adopted_job

    run_dir = Path(args.adopt or args.run_dir)
    return asyncio.run(adopted_job(_request(args, run_dir), state))
