"""`srtr status`: a run's pools and instances, once or on every change (`--watch`).

It and the other verbs that look at a run dir (`cli.logs`, `cli.control_verbs`) read
state.json through the run dir's one reader (`srtr.store.rundir`); `cli.run_state.read_run`
is its CLI face, which turns a missing, torn or foreign file into an exit-2 line instead of
a traceback. `status -o json` prints state.json exactly as written.

A big job (one that keeps a delta log, `srtr.store.state_log`) also keeps summary.json: the
job, its pools and, per service, how many instances are in each phase. `srtr status` prints
that instead of a table of every instance (which `--all` or `-o json` still give), so it
reads a few kilobytes whatever the job's size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli.run_state import check_liveness as check_liveness
from srtr.cli.run_state import read_run as read_run

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from srtr.runtime.liveness import Liveness
    from srtr.store.rundir import RunState


def add_verbs(verbs: Any) -> None:
    """`status`, on the CLI's sub-parsers."""
    status = verbs.add_parser("status", help="show a run's pools and instances")
    status.add_argument("run_dir", metavar="RUN_DIR")
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")
    status.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="print again whenever state.json changes, until Ctrl+C",
    )
    status.add_argument(
        "--all",
        action="store_true",
        help="list every instance, also of a big job (whose status is otherwise a summary)",
    )
    status.add_argument(
        "--raw",
        action="store_true",
        help="print programs' text (reasons, messages) as it is, control characters included, "
        "to a terminal too",
    )
    status.set_defaults(func=cmd_status)


# -- status ---------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if getattr(args, "watch", False):
        return _watch(run_dir, args.output, getattr(args, "all", False))
    if args.output == "text" and not getattr(args, "all", False):
        from srtr.store.rundir import read_summary

        summary = read_summary(run_dir)
        if summary is not None:
            print_summary(_console(), run_dir, summary)
            return 0
    state = read_run(run_dir)
    if args.output == "json":
        print(json.dumps(state.doc, indent=2))
        return 0
    print_status(_console(), run_dir, state, raw=getattr(args, "raw", False))
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
    console: Console, run_dir: Path, state: RunState, now: float | None = None, *, raw: bool = False
) -> None:
    """The job, its pools, its instances and its exporters, as the TUI's view-model sees
    them (`srtr.tui.viewmodel`: the same READY, counts, ages and exits as the TUI). On a
    terminal, programs' text shows its control characters instead of obeying them, unless
    `raw` (`terminal_text`)."""
    from rich.text import Text

    from srtr.cli.crash import crash_line
    from srtr.cli.terminal_text import clean_doc

    if console.is_terminal and not raw:
        state = type(state)(clean_doc(state.doc))

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
        from srtr.store.cause_block import block, job_cause

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


# -- the summary of a big job ------------------------------------------------------------

# Phases in the order a reader scans them: the alarming ones last, where the eye ends.
_ORDER = ("Ready", "Running", "Succeeded", "Stopped", "Pending", "Starting", "Terminating")


def summary_state(summary: dict[str, Any]) -> RunState:
    from srtr.store.rundir import RunState

    """The summary's job as a state without instances: what the job's lines read."""
    spare = [{"name": n, "ip": "", "state": "spare"} for n in summary.get("spare", [])]
    doc = {
        "job": summary["job"],
        "pools": summary.get("pools", []),
        "recipe": summary.get("recipe") or {},
        "nodes": spare,
        "instances": [],
    }
    return RunState.from_doc(doc)


def print_summary(console: Console, run_dir: Path, summary: dict[str, Any]) -> None:
    """The job's lines, then its pools, its services' counts and what is not as desired."""
    from rich.text import Text

    from srtr.cli.crash import crash_line

    state = summary_state(summary)
    _print_job(console, state, time.time(), check_liveness(run_dir, state))
    crashed = crash_line(run_dir, state)
    if crashed:
        console.print(Text(crashed, style="yellow"))
    services = summary.get("services", [])
    for pool in summary.get("pools", []):
        line = f"pool {pool.get('name')} on {pool.get('hosts')} ({pool.get('node_count')} nodes)"
        if pool.get("pending"):
            line += f" · Pending: {pool['pending']}"
        console.print(Text(line))
    count, nodes = summary.get("instance_count", 0), summary.get("node_count", 0)
    console.print(Text(f"{count} instance(s) on {nodes} node(s)"))
    for service in services:
        console.print(Text("  " + _service_line(service)))
    _print_not_desired(console, summary)
    exporters = summary.get("exporters") or {}
    if exporters.get("total"):
        console.print(
            Text(
                f"exporters: {exporters['listed']}/{exporters['total']} listed in "
                f"prometheus/targets.json, {exporters['up']} up"
            )
        )
    if state.ended:
        from srtr.store.cause_block import block, job_cause

        for line in block(run_dir, job_cause(state)):
            console.print(Text(line, style="red" if line.startswith("first") else ""))
    console.print(Text("every instance: srtr status --all (or -o json)", style="dim"))


def _service_line(service: dict[str, Any]) -> str:
    phases: dict[str, int] = service.get("phases", {})
    ordered = sorted(phases, key=lambda p: (_ORDER.index(p) if p in _ORDER else len(_ORDER), p))
    counts = ", ".join(f"{phases[p]} {p}" for p in ordered)
    where = f"{service.get('kind')} of pool {service['pool']}" if service.get("pool") else ""
    name = f"{service.get('service')} ({where})" if where else str(service.get("service"))
    return f"{name}: {service.get('ready')}/{service.get('total')} ready · {counts}"


def _print_not_desired(console: Console, summary: dict[str, Any]) -> None:
    from rich.text import Text

    total = int(summary.get("not_desired_count") or 0)
    if not total:
        console.print(Text("every instance is as desired (ready, or done)"))
        return
    console.print(Text(f"not as desired: {total} instance(s)", style="yellow"))
    listed = summary.get("not_desired", [])
    for inst in listed:
        console.print(Text(f"  {inst['name']}  {inst['phase']}  on {inst['node']}"))
    if total > len(listed):
        console.print(Text(f"  … and {total - len(listed)} more"))


def _watch(run_dir: Path, output: str, everything: bool = False) -> int:
    """Reprint the status whenever the state changes (state.json, a big job's delta log and
    summary; inotify through watchfiles, no busy poll) until Ctrl+C, which exits 0. Each
    screen replaces the last on a terminal."""
    import watchfiles

    from srtr.store.rundir import STATE_FILES, read_summary, state_version
    from srtr.store.state_delta import SUMMARY_FILE

    console = _console()
    shown: list[object] = [None]
    watched = {*STATE_FILES, SUMMARY_FILE}  # a big job's summary is replaced after the log

    def version() -> object:
        try:
            summary: object = (run_dir / SUMMARY_FILE).stat().st_mtime_ns
        except OSError:
            summary = None
        return state_version(run_dir), summary

    def show() -> None:
        shown[0] = version()
        summary = None if output == "json" or everything else read_summary(run_dir)
        state = read_run(run_dir) if summary is None else None
        if state is not None and output == "json":
            print(json.dumps(state.doc, indent=2), flush=True)
            return
        if console.is_terminal:
            console.clear()
        if summary is not None:
            print_summary(console, run_dir, summary)
        elif state is not None:
            print_status(console, run_dir, state)
        console.file.flush()

    show()
    try:
        # state.json is replaced by rename: watch the directory, filter on the names.
        # A write between the first screen and the watch's start raises no event: each
        # second without one, the files are compared with what was shown (two stats).
        for changes in watchfiles.watch(
            run_dir,
            watch_filter=lambda _, path: Path(path).name in watched,
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
