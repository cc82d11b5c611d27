"""`srtr restart RUN NAME` and `srtr stop RUN NAME`: the TUI's `r` and `s` from a shell.

NAME is an instance, or a service (every instance of it), like process-compose's
`process restart`. The verbs send the same control intents as the TUI (`restart`, `stop`
of `controllers.intents`); the job decides and answers. Exit codes: 0 the job took it,
1 the job refused it (the message says why: tearing down, skipped, already stopped),
2 bad input (not a run dir, no such instance or service, the job is not running).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from srtr.cli import bad
from srtr.cli.run_state import read_run

EXIT_REFUSED = 1


def add_verbs(verbs: Any) -> None:
    for op, text in (
        ("restart", "restart an instance, or every instance of a service, of a running job"),
        ("stop", "stop an instance, or every instance of a service, of a running job for good"),
    ):
        verb = verbs.add_parser(op, help=text, description=text + ".")
        verb.add_argument("run_dir", metavar="RUN_DIR")
        verb.add_argument("name", metavar="NAME", help="an instance name, or a service name")
        verb.set_defaults(func=cmd_control, op=op)


def cmd_control(args: argparse.Namespace) -> int:
    from srtr.cli.run_state import check_liveness
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
