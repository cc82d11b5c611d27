"""The `srtr` command: verbs → calls into resources, the reconciler's run dir and the runtime.

stdout carries what the user asked for (`plan`, `-o json`, `status`); diagnostics go to
stderr. Bad input prints `FILE:LINE: path: message` lines and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from srtr import __version__
from srtr.cli.errors import EXIT_BAD_INPUT, EXIT_PIPE_CLOSED, StoppedBySignal
from srtr.cli.parser import Parser
from srtr.cli.plan import PLAN_VERBS, cmd_plan
from srtr.resources.errors import RecipeError

# Every verb family, one module each, in `srtr -h` order; each adds its verbs with
# `add_verbs`. `srtr plan` builds only the first: the others' modules cost its start-up.
VERB_FAMILIES = ("plan", "run", "submit", "status", "wait", "logs", "control_verbs")


def build_parser(*, run_verbs: bool = True) -> argparse.ArgumentParser:
    """Every verb's parser; without `run_verbs`, only the planning verbs' (plan, dry-run,
    schema), which parse their own command lines just as the full parser does."""
    parser = Parser(
        prog="srtr",
        description="Run multi-service jobs on whole nodes of a SLURM allocation.",
    )
    parser.add_argument("--version", action="version", version=f"srtr {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for family in VERB_FAMILIES if run_verbs else VERB_FAMILIES[:1]:
        importlib.import_module(f"srtr.cli.{family}").add_verbs(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # `srtr plan ...` selects the plan parser whatever other verbs exist (a verb is never
    # abbreviated), and its errors are its own; building `up`'s, `status`'s and the others'
    # parsers, and importing their modules, was ~37 M instructions of every plan's start-up.
    parser = build_parser(run_verbs=not words or words[0] not in PLAN_VERBS)
    args, extras = parser.parse_known_args(words)
    if extras:
        verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        verb = verbs.choices.get(args.verb)
        (verb if isinstance(verb, Parser) else parser).unknown(extras)  # type: ignore[attr-defined]
    code = _run(args)
    if argv is None and (args.func is cmd_plan or _headless_up(args)):
        _exit_now(code)
    return code


def _headless_up(args: argparse.Namespace) -> bool:
    """`srtr up --headless`, whose job is over: its run dir's files are closed, its agents
    gone. Tearing its interpreter down freed a 10,000-node job's objects one by one, about
    a second more after SIGTERM before the process was gone."""
    return args.verb == "up" and bool(getattr(args, "headless", False))


def _exit_now(code: int) -> NoReturn:
    """End the process without tearing the interpreter down: ~50 M instructions (~18 ms) of
    freeing every module and, for a 1,000-node plan, 5,000 instance specs one by one, none of
    which a verb that only prints needs. Only from the console script (`argv` None): tests
    call `main` in-process. Nothing of `plan` or `up` registers atexit work; both streams
    are flushed here, where a closed reader is still quiet (`main`'s EPIPE handling)."""
    logging.shutdown()  # `up`'s srtr.log handler: flushed and closed, as at a normal exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a reader that left is EPIPE, caught below
        return code
    except BrokenPipeError:
        # `srtr ... | head`: the reader has what it wanted. Quiet, as other CLIs are; stdout
        # points at /dev/null so that the interpreter's last flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE_CLOSED
    except RecipeError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except StoppedBySignal as exc:
        return exc.code
