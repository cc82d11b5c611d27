"""The verbs that look at a run dir: status, logs (`cli.logs`), tui, and down (which asks its
job to end).

They read state.json through the run dir's one reader (`srtr.reconciler.rundir`);
`read_run` is its CLI face, which turns a missing, torn or foreign file into an exit-2
line instead of a traceback. `srtr up` uses it too, on a run dir it is asked to reuse or
to adopt. `status -o json` prints state.json exactly as written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli import bad

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from srtr.reconciler.rundir import RunState
    from srtr.runtime.liveness import Liveness


def add_verbs(verbs: Any) -> None:
    """`status`, `logs`, `tui` and `down`, on the CLI's sub-parsers."""
    status = verbs.add_parser("status", help="show a run's pools and instances")
    status.add_argument("run_dir", metavar="RUN_DIR")
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")
    status.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="print again whenever state.json changes, until Ctrl+C",
    )
    status.set_defaults(func=cmd_status)

    from srtr.cli import logs

    logs.add_parser(verbs)

    tui = verbs.add_parser(
        "tui",
        help="watch and drive a running job from another terminal; a finished one read-only",
    )
    tui.add_argument("run_dir", metavar="RUN_DIR")
    tui.add_argument(
        "--theme",
        metavar="NAME",
        help="dark (default), light, terminal (its own colours), or a Textual theme; "
        "default $SRTR_THEME",
    )
    tui.set_defaults(func=cmd_tui)

    down = verbs.add_parser("down", help="ask a running `srtr up` to tear down gracefully")
    down.add_argument("run_dir", metavar="RUN_DIR")
    down.add_argument("--now", action="store_true", help="SIGKILL everything at once")
    down.set_defaults(func=cmd_down)


def read_run(run_dir: Path) -> RunState:
    """`run_dir`'s state.json. Raises RecipeError (exit 2) when it cannot be read."""
    from srtr.reconciler.rundir import StateFileError, read_state

    try:
        return read_state(run_dir)
    except StateFileError as exc:
        if exc.missing:
            raise bad(str(run_dir), "no state.json here; is this a run dir of `srtr up`?") from None
        if exc.foreign:
            raise bad(str(exc.path), "not an srtr state file") from None
        raise bad(str(exc.path), f"cannot read the state file: {exc}") from None


# -- status ---------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if getattr(args, "watch", False):
        return _watch(run_dir, args.output)
    state = read_run(run_dir)
    if args.output == "json":
        print(json.dumps(state.doc, indent=2))
        return 0
    print_status(_console(), run_dir, state)
    return 0


def _console() -> Console:
    from rich.console import Console

    class PipeAware(Console):
        def on_broken_pipe(self) -> None:
            # Rich would exit 1; the CLI's main exits as a SIGPIPE'd CLI does (141).
            raise BrokenPipeError

    # markup=False: recipe paths (`services[api]`), reasons and commands are user text and
    # must print as written; colours come from Text styles only. Piped output is for grep
    # and tests: never truncate cells to an 80-column guess.
    return PipeAware(highlight=False, markup=False, width=None if sys.stdout.isatty() else 1000)


def print_status(
    console: Console, run_dir: Path, state: RunState, now: float | None = None
) -> None:
    """The job, its pools, its instances and its exporters, as the TUI's view-model sees
    them (`srtr.tui.viewmodel`: the same READY, counts, ages and exits as the TUI)."""
    from rich.text import Text

    from srtr.cli.crash import crash_line

    now = time.time() if now is None else now
    # Liveness is the heartbeat and SLURM's word (`runtime.liveness`), never a local pid.
    liveness = check_liveness(run_dir, state)
    _print_job(console, state, now, liveness)
    crashed = crash_line(run_dir, state)
    if crashed:
        console.print(Text(crashed, style="yellow"))
    _print_pools(console, state)
    console.print(_instances_table(state, now))
    _print_exporters(console, state)
    if state.ended:  # a running job's first failure may yet be healed by its restarts
        from srtr.reconciler.cause_block import block, job_cause

        for line in block(run_dir, job_cause(state)):
            console.print(Text(line, style="red" if line.startswith("first") else ""))


def controller_summary(liveness: Liveness) -> str:
    """`running (last heartbeat 0.4s ago on node1; SLURM job 12: RUNNING)`, or gone, ..."""
    return f"{liveness.word()} ({liveness.describe()})"


def _print_job(console: Console, state: RunState, now: float, liveness: Liveness) -> None:
    from rich.text import Text

    from srtr.tui.viewmodel import header
    from srtr.tui.viewmodel.notes import recipe_drift, spare_nodes

    job = state.job
    alive = liveness.running
    view = header(dict(state.doc), now, controller_alive=alive)
    line = Text()
    line.append(view.name, style="bold")
    line.append(f"  backend={view.backend}")
    if job.get("launcher"):
        line.append(f"  launcher={job.get('launcher')}")
    if job.get("slurm_job_id"):
        line.append(f"  slurm_job={job['slurm_job_id']}")
    line.append("  phase=")
    line.append(view.phase, style=view.phase_style)
    if job.get("exit_code") is not None:
        line.append(f"  exit_code={job['exit_code']}")
    line.append(f"  {view.generation}")
    if view.elapsed:
        line.append(f"  age {view.elapsed}")
    line.append(f"  controller={controller_summary(liveness)}")
    console.print(line)
    if view.stage and not state.ended:
        console.print(Text(view.stage))
    if view.reason:
        console.print(Text(f"reason: {view.reason}"))
    end_time = job.get("end_time")
    if end_time and alive:
        left = max(0, int(end_time - now))
        console.print(Text(f"time left in the allocation: {left // 60}m{left % 60:02d}s"))
    spares = spare_nodes(dict(state.doc))
    if spares:
        console.print(Text(f"spare nodes: {_hostlist(spares)} ({len(spares)})"))
    shown = _print_recipe(console, state)
    drift = recipe_drift(dict(state.doc))
    if drift and drift != shown:
        console.print(Text(drift, style="yellow"))
    for fault in state.write_faults:  # as of this state.json; the job goes on regardless
        since = time.strftime("%H:%M:%S", time.localtime(fault["since"]))
        text = Text()
        text.append(f"cannot write {fault['file']}", style="yellow")
        text.append(f": {fault['error']} (since {since}, {fault['failures']} failed write(s))")
        console.print(text)


def _print_recipe(console: Console, state: RunState) -> str:
    """A pending, rejected or discarded live edit, as the TUI's plan panel shows it; returns
    the summary line printed ('' for none)."""
    from rich.text import Text

    from srtr.tui.viewmodel import plan_view

    view = plan_view(dict(state.doc))
    if view is None:
        return ""
    summary = f"pending edit: {view.summary}" if view.pending else view.summary
    console.print(Text(summary, style="" if view.pending else "yellow"))
    for style, line in view.lines:
        console.print(Text(f"  {line}", style=style))
    return summary


def _hostlist(nodes: list[str]) -> str:
    import hostlist

    return str(hostlist.collect_hostlist(nodes))


def _print_pools(console: Console, state: RunState) -> None:
    from rich.text import Text

    from srtr.tui.viewmodel import other_services, pools

    doc = dict(state.doc)
    for pool in pools(doc):
        line = Text("pool ")
        line.append(pool.owner.text, style=pool.owner.style)
        line.append(f" on {pool.nodes}")
        if pool.riders:
            line.append(" · riders: ")
            for index, rider in enumerate(pool.riders):
                if index:
                    line.append(", ")
                line.append(rider.text, style=rider.style)
        else:
            line.append(" · no riders")
        if pool.scale:
            line.append(f" · {pool.scale}", style="cyan")
        if pool.pending:
            line.append(f" · Pending: {pool.pending}", style="yellow")
        console.print(line)
    others = other_services(doc)
    if others and state.pools:
        line = Text("other services: ")
        for index, service in enumerate(others):
            if index:
                line.append(", ")
            line.append(service.text, style=service.style)
        console.print(line)


def _instances_table(state: RunState, now: float) -> Table:
    from rich.table import Table
    from rich.text import Text

    from srtr.tui.viewmodel import COLUMNS, PHASE_COLUMN, instance_row, phase_style
    from srtr.tui.viewmodel.notes import countdown

    table = Table(box=None, pad_edge=False)
    for _, title in COLUMNS:
        table.add_column(title)
    table.add_column("PID")
    table.add_column("NOTE")
    for inst in state.instances:
        row = instance_row(inst, now)
        cells: list[str | Text] = list(row.cells)
        cells[PHASE_COLUMN] = Text(row.phase, style=phase_style(row.phase))
        note = countdown(inst, now) or str(inst.get("probe_message") or "")
        table.add_row(*cells, "" if inst["pid"] is None else str(inst["pid"]), Text(note))
    return table


def _print_exporters(console: Console, state: RunState) -> None:
    from rich.text import Text

    exporters = state.exporters
    if not exporters:
        return
    listed = [e for e in exporters if e.get("listed")]
    up = sum(1 for e in listed if e.get("up"))
    listing = f"{len(listed)}/{len(exporters)} listed in prometheus/targets.json, {up} up"
    console.print(Text(f"exporters: {listing}"))
    for e in listed:
        if e.get("up") is False:
            console.print(Text(f"  down: {e['url']} ({e['instance']}): {e.get('last_error')}"))


def _watch(run_dir: Path, output: str) -> int:
    """Reprint the status whenever state.json changes (inotify through watchfiles, no busy
    poll) until Ctrl+C, which exits 0. Each screen replaces the last on a terminal."""
    import watchfiles

    console = _console()
    shown: list[tuple[int, int, int] | None] = [None]

    def version() -> tuple[int, int, int] | None:
        try:
            st = (run_dir / "state.json").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size  # replaced by rename: a new inode

    def show() -> None:
        shown[0] = version()
        state = read_run(run_dir)
        if output == "json":
            print(json.dumps(state.doc, indent=2), flush=True)
            return
        if console.is_terminal:
            console.clear()
        print_status(console, run_dir, state)
        console.file.flush()

    show()
    try:
        # state.json is replaced by rename: watch the directory, filter on the name.
        # A write between the first screen and the watch's start raises no event: each
        # second without one, state.json is compared with what was shown (one stat).
        for changes in watchfiles.watch(
            run_dir,
            watch_filter=lambda _, path: Path(path).name == "state.json",
            recursive=False,
            debounce=100,
            rust_timeout=1000,
            yield_on_timeout=True,
        ):
            if changes or version() != shown[0]:
                show()
    except KeyboardInterrupt:
        return 0
    return 0


# -- logs, tui, down ------------------------------------------------------------------------


def cmd_tui(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    read_run(run_dir)  # a clear error for a path that is not a run dir
    try:
        from srtr.tui.launch import attach
        from srtr.tui.themes import ThemeError, resolve
    except ImportError as exc:
        raise bad("srtr tui", f"the TUI is not available: {exc}") from None
    try:
        resolve(args.theme)
    except ThemeError as exc:
        raise bad("srtr tui", str(exc)) from None
    return attach(run_dir, theme=args.theme)


def cmd_down(args: argparse.Namespace) -> int:
    """Ask the job to tear down over its control channel. Never signals a pid: one read
    from state.json may be anyone's process on this host. When no controller answers, say
    what is known and how to end the job without it (exit 1)."""
    run_dir = Path(args.run_dir)
    state = read_run(run_dir)
    job = state.job
    if state.ended:
        raise bad(str(run_dir), f"the job is not running (phase {job['phase']})")
    from srtr.runtime.control import ControlError, Unreachable, send

    try:
        message = send(run_dir, "kill" if args.now else "teardown")
    except Unreachable as exc:
        print(f"srtr down: {exc}", file=sys.stderr)
        print(f"srtr down: {down_advice(check_liveness(run_dir, state))}", file=sys.stderr)
        return 1
    except ControlError as exc:
        raise bad(str(run_dir), f"the job refused: {exc}") from None
    print(f"{job['name']}: {message}; follow with `srtr status {args.run_dir}`")
    return 0


def check_liveness(run_dir: Path, state: RunState, *, slurm: bool = True) -> Liveness:
    from srtr.runtime.liveness import check

    return check(run_dir, state, slurm=slurm)


def down_advice(liveness: Liveness) -> str:
    """What `srtr down` knows of a job it cannot reach, and the way out."""
    known = liveness.describe()
    if liveness.slurm_job_id and liveness.slurm_state != "":
        return (
            f"{known}. To end the job without its controller, cancel srtr's SLURM job: "
            f"`scancel {liveness.slurm_job_id}`"
        )
    if liveness.running:
        return f"{known}: the controller beats but does not answer from here; try again"
    return f"{known}: nothing of srtr's is known to run"
