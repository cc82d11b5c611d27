"""The verbs that act on a running job from another terminal: `tui`, `down`, `restart`, `stop`.

`srtr restart RUN NAME` and `srtr stop RUN NAME` are the TUI's `r` and `s` from a shell.
NAME is an instance, or a service (every instance of it), like process-compose's `process
restart`. The verbs send the same control intents as the TUI (`restart`, `stop` of
`controllers.intents`); the job decides and answers. Exit codes: 0 the job took it, 1 the
job refused it (the message says why: tearing down, skipped, already stopped), 2 bad input
(not a run dir, no such instance or service, the job is not running).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli.errors import bad
from srtr.cli.run_state import check_liveness, read_run

if TYPE_CHECKING:
    from srtr.runtime.liveness import Liveness

EXIT_REFUSED = 1


def add_verbs(verbs: Any) -> None:
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
    # Private: `srtr up` starts its TUI so (srtr.tui.up_process), not a user.
    tui.add_argument("--up-fd", type=int, help=argparse.SUPPRESS)
    tui.set_defaults(func=cmd_tui)

    down = verbs.add_parser("down", help="ask a running `srtr up` to tear down gracefully")
    down.add_argument("run_dir", metavar="RUN_DIR")
    down.add_argument("--now", action="store_true", help="SIGKILL everything at once")
    down.set_defaults(func=cmd_down)

    for op, text in (
        ("restart", "restart an instance, or every instance of a service, of a running job"),
        ("stop", "stop an instance, or every instance of a service, of a running job for good"),
    ):
        verb = verbs.add_parser(op, help=text, description=text + ".")
        verb.add_argument("run_dir", metavar="RUN_DIR")
        verb.add_argument("name", metavar="NAME", help="an instance name, or a service name")
        verb.set_defaults(func=cmd_control, op=op)


def cmd_control(args: argparse.Namespace) -> int:
    from srtr.controllers.intents import resolve
    from srtr.runtime.control import ControlError, send

    run_dir = Path(args.run_dir)
    state = read_run(run_dir)
    job = state.job
    if state.ended or not check_liveness(run_dir, state, slurm=False).running:
        raise bad(
            str(run_dir),
            f"the job {job['name']} is not running (phase {job['phase']}); nothing to {args.op}",
        )
    services = {str(i["name"]): str(i.get("service", "")) for i in state.instances}
    try:
        resolve(args.name, services)  # a typo is bad input (2), with a did-you-mean
    except LookupError as exc:
        raise bad(str(run_dir), str(exc)) from None
    try:
        message = send(run_dir, args.op, args.name)
    except ControlError as exc:
        print(f"srtr {args.op}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"{job['name']}: {message}")
    return 0


def cmd_tui(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if args.up_fd is not None:  # the TUI of `srtr up`: the run dir may not exist yet
        from srtr.tui.launch import follow_up

        return follow_up(run_dir, args.up_fd, theme=args.theme)
    try:
        from srtr.tui.launch import attach
        from srtr.tui.source import RunSource
        from srtr.tui.themes import ThemeError, resolve
    except ImportError as exc:
        raise bad("srtr tui", f"the TUI is not available: {exc}") from None
    # A clear error for a path that is not a run dir, read by the TUI's own reader: a big
    # job's state (tens of MB) is parsed once, and is the TUI's first frame.
    source = RunSource(run_dir)
    state = read_run(run_dir, lambda _: source.first_state())
    try:
        resolve(args.theme)
    except ThemeError as exc:
        raise bad("srtr tui", str(exc)) from None
    return attach(run_dir, theme=args.theme, source=source, state=state)


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
