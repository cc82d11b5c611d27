"""The verbs that look at a run dir: status, logs, tui, and down (which asks its job to end).

They read state.json through the run dir's one reader (`srtr.reconciler.rundir`);
`read_run` is its CLI face, which turns a missing, torn or foreign file into an exit-2
line instead of a traceback. `srtr up` uses it too, on a run dir it is asked to reuse or
to adopt. `status -o json` prints state.json exactly as written.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli import bad
from srtr.reconciler.rundir import RunState, StateFileError, read_state, ready_now

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

STATUS_COLUMNS = ("NAME", "SERVICE", "KIND", "NODE", "IP", "PHASE", "READY", "RESTARTS", "EXIT")


def add_verbs(verbs: Any) -> None:
    """`status`, `logs`, `tui` and `down`, on the CLI's sub-parsers."""
    status = verbs.add_parser("status", help="show a run's pools and instances")
    status.add_argument("run_dir", metavar="RUN_DIR")
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")
    status.set_defaults(func=cmd_status)

    logs = verbs.add_parser("logs", help="print an instance's log")
    logs.add_argument("run_dir", metavar="RUN_DIR")
    logs.add_argument("instance", metavar="INSTANCE")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.set_defaults(func=cmd_logs)

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
    state = read_run(Path(args.run_dir))
    if args.output == "json":
        print(json.dumps(state.doc, indent=2))
        return 0
    from rich.console import Console

    # Piped output is for grep and tests: never truncate cells to an 80-column guess.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)
    _print_job(console, state)
    _print_pools(console, state)
    console.print(_instances_table(state))
    _print_exporters(console, state)
    return 0


def _print_job(console: Console, state: RunState) -> None:
    job = state.job
    alive = state.running
    console.print(
        f"[bold]{job['name']}[/bold]  backend={job['backend']}  phase={job['phase']}"
        f"  exit_code={job['exit_code']}  gen {job['generation']}/{job['observed_generation']}"
        f"  controller={'running' if alive else 'gone'} (pid {job['controller_pid']})"
    )
    if job.get("reason"):
        console.print(f"reason: {job['reason']}")
    end_time = job.get("end_time")
    if end_time and alive:
        left = max(0, int(end_time - time.time()))
        console.print(f"time left in the allocation: {left // 60}m{left % 60:02d}s")
    for fault in state.write_faults:  # as of this state.json; the job goes on regardless
        since = time.strftime("%H:%M:%S", time.localtime(fault["since"]))
        console.print(
            f"[yellow]cannot write {fault['file']}[/yellow]: {fault['error']} "
            f"(since {since}, {fault['failures']} failed write(s))"
        )


def _print_pools(console: Console, state: RunState) -> None:
    instances = state.instances
    for pool_doc in state.pools:
        owners = [i for i in instances if i["pool"] == pool_doc["name"] and i["kind"] == "owner"]
        ready = sum(1 for i in owners if ready_now(i))
        riders = ", ".join(pool_doc["riders"]) or "no riders"
        console.print(
            f"pool {pool_doc['name']} {ready}/{len(owners)} ready on "
            f"{', '.join(pool_doc['nodes'])} ({riders})"
        )


def _instances_table(state: RunState) -> Table:
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in (*STATUS_COLUMNS, "PID"):
        table.add_column(column)
    for i in state.instances:
        table.add_row(
            i["name"],
            i["service"],
            i["kind"],
            i["node"],
            i["node_ip"],
            i["phase"],
            "yes" if i["ready"] else "no",
            str(i["restarts"]),
            "" if i["exit_code"] is None else str(i["exit_code"]),
            "" if i["pid"] is None else str(i["pid"]),
        )
    return table


def _print_exporters(console: Console, state: RunState) -> None:
    exporters = state.exporters
    if not exporters:
        return
    listed = [e for e in exporters if e.get("listed")]
    up = sum(1 for e in listed if e.get("up"))
    console.print(
        f"exporters: {len(listed)}/{len(exporters)} listed in prometheus/targets.json, {up} up"
    )
    for e in listed:
        if e.get("up") is False:
            console.print(f"  down: {e['url']} ({e['instance']}): {e.get('last_error')}")


# -- logs, tui, down ------------------------------------------------------------------------


def cmd_logs(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    state = read_run(run_dir)
    names = {i["name"]: i for i in state.instances}
    if args.instance not in names:
        raise bad(
            str(run_dir), f"no instance {args.instance!r}; instances: " + ", ".join(sorted(names))
        )
    path = run_dir / names[args.instance]["log"]
    if not path.exists():
        print(f"{path}: no output yet", file=sys.stderr)
        if not args.follow:
            return 0
    offset = 0
    out = sys.stdout.buffer
    while True:
        if path.exists():
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
                offset += len(chunk)
                out.write(chunk)
                out.flush()
        if not args.follow:
            return 0
        if not read_run(run_dir).running:
            return 0
        time.sleep(0.25)  # a CLI tail, not the controller: polling a file here is fine


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
    state = read_run(Path(args.run_dir))
    job = state.job
    pid = job["controller_pid"]
    if not state.running:
        raise bad(str(args.run_dir), f"the job is not running (phase {job['phase']})")
    from srtr.runtime.control import ControlError, send

    try:
        message = send(Path(args.run_dir), "kill" if args.now else "teardown")
    except ControlError as exc:
        # A controller without a reachable socket still honours SIGTERM.
        print(f"{exc}; sending SIGTERM to pid {pid}", file=sys.stderr)
        os.kill(pid, signal.SIGTERM)
        message = "asked by SIGTERM to tear down"
    print(f"{job['name']}: {message}; follow with `srtr status {args.run_dir}`")
    return 0
