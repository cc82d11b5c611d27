"""The `srtr` command: verbs → calls into resources, reconciler and backends.

stdout carries what the user asked for (`plan`, `-o json`, `status`); diagnostics go to
stderr. Bad input prints `FILE:LINE: path: message` lines and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from srtr import __version__
from srtr.resources.errors import Problem, RecipeError

EXIT_BAD_INPUT = 2
EXIT_PIPE_CLOSED = 128 + 13  # as a CLI killed by SIGPIPE: `srtr plan x.yaml | head`


class Parser(argparse.ArgumentParser):
    """argparse with did-you-mean (Python 3.14's `suggest_on_error`, by hand: 3.11 has
    none): an unknown verb or option gets the closest known one, under the verb's usage."""

    def error(self, message: str) -> NoReturn:
        match = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(3))
            message += _suggest(match.group(2), choices)
        super().error(message)

    def unknown(self, extras: list[str]) -> NoReturn:
        """`srtr VERB --frob`: this verb's usage, and the option it most likely meant."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = "".join(_suggest(e.split("=", 1)[0], known) for e in extras if e.startswith("-"))
        self.error(f"unrecognized arguments: {' '.join(extras)}{hints}")


def _suggest(word: str, choices: Sequence[str]) -> str:
    import difflib  # only on a usage error: every verb's start-up would pay for it

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class StoppedBySignal(BaseException):
    """SIGTERM or SIGHUP before the job's loop handles signals (salloc, planning)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.code = 128 + signum


def bad(where: str, message: str) -> RecipeError:
    """An input error of a verb: printed as `WHERE: message`, exit 2."""
    return RecipeError(where, [Problem((), message)])


def _allocation(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    from srtr.resources.expand import local_allocation

    if getattr(args, "nodelist", None):
        import hostlist

        try:
            names = hostlist.expand_hostlist(args.nodelist)
        except hostlist.BadHostlist as exc:
            raise RecipeError("--nodelist", [Problem((), f"bad node list: {exc}")]) from None
        # Outside a cluster the IPs are unknown; show that rather than invent them.
        return [(name, f"<ip:{name}>") for name in names]
    if getattr(args, "nodes", None):
        return local_allocation(args.nodes)
    return None


def cmd_plan(args: argparse.Namespace) -> int:
    with _one_shot():
        return _plan(args)


PYDANTIC_PLUGINS = "PYDANTIC_DISABLE_PLUGINS"


@contextlib.contextmanager
def _one_shot() -> Iterator[None]:
    """What a verb that plans and exits does without, each ~5-10 % of `srtr plan`:

    - the cyclic collector: everything it builds lives until it prints (5,000 instance specs
      for a 1,000-node plan), so its passes free nothing;
    - pydantic's plugins (observability hooks for an application's models; none has a use
      for srtr's recipe models): finding them reads the metadata of every installed
      distribution when the first model is built. Unless the user set the variable.

    Both come back after: tests call `main` in-process."""
    enabled = gc.isenabled()
    gc.disable()
    ours = PYDANTIC_PLUGINS not in os.environ
    if ours:
        os.environ[PYDANTIC_PLUGINS] = "__all__"
    try:
        yield
    finally:
        if ours:
            os.environ.pop(PYDANTIC_PLUGINS, None)
        if enabled:
            gc.enable()


def _plan(args: argparse.Namespace) -> int:
    from srtr.resources.planning import plan_file
    from srtr.resources.render import plan_json, plan_text

    if args.against:
        return _plan_against(args)
    from srtr.resources.launchers import Launcher

    recipe, state = plan_file(args.recipe, _allocation(args))
    for warning in state.warnings:
        print(f"{args.recipe}: warning: {warning}", file=sys.stderr)
    for line in state.line_warnings:  # FILE:LINE: warning: path: message already
        print(line, file=sys.stderr)
    launcher = Launcher(args.launcher) if args.launcher else None
    if launcher is None and args.nodelist:
        launcher = Launcher.AGENT  # a SLURM node list: the SLURM default (`srtr up`)
    if args.output == "json":
        print(json.dumps(plan_json(recipe, state, launcher), indent=2))
    else:
        sys.stdout.write(plan_text(recipe, state, launcher))
    return 0


def _plan_against(args: argparse.Namespace) -> int:
    """Diff a recipe against the job running in a run dir, without applying anything."""
    from pathlib import Path

    from srtr.cli.pins import read_pins
    from srtr.reconciler.rundir import StateFileError, read_state
    from srtr.resources.diff import diff, render
    from srtr.resources.loading import read_text
    from srtr.resources.objects import NodeMap
    from srtr.resources.planning import plan_text_source

    run_dir = Path(args.against)
    try:
        state = read_state(run_dir)
        allocation = [(n["name"], n["ip"]) for n in state.doc["nodes"]]
        nodes = NodeMap.from_json(state.doc["carve"], state.doc["nodes"])
    except (StateFileError, KeyError, TypeError) as exc:
        raise bad(str(run_dir), f"not a readable run dir: {exc}") from None
    applied = run_dir / "recipe.yaml"
    pins = read_pins(run_dir)  # the job's: plan both sides as the job itself would
    _, old = plan_text_source(read_text(applied), str(applied), allocation, nodes, pins=pins)
    _, new = plan_text_source(read_text(args.recipe), args.recipe, allocation, nodes, pins=pins)
    launched = frozenset(i["name"] for i in state.instances if i.get("pid") is not None)
    plan = diff(old, new, launched=launched)
    if args.output == "json":
        print(json.dumps(plan.to_json(), indent=2))
    else:
        sys.stdout.write(render(plan))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from srtr.resources.recipe import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


PLAN_VERBS = ("plan", "dry-run")


def build_parser(*, run_verbs: bool = True) -> argparse.ArgumentParser:
    """Every verb's parser; without `run_verbs`, only those defined here (plan, dry-run,
    schema), which parse their own command lines just as the full parser does."""
    parser = Parser(
        prog="srtr",
        description="Run multi-service jobs on whole nodes of a SLURM allocation.",
    )
    parser.add_argument("--version", action="version", version=f"srtr {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    for name in PLAN_VERBS:
        plan = verbs.add_parser(
            name,
            help="validate a recipe and print where every instance runs (runs nothing)"
            if name == "plan"
            else "alias of plan",
        )
        plan.add_argument("recipe", help="recipe YAML file")
        where = plan.add_mutually_exclusive_group()
        where.add_argument(
            "--nodes",
            type=_positive_int,
            metavar="N",
            help="plan on N local nodes node1..nodeN (default: what fits)",
        )
        where.add_argument(
            "--nodelist", metavar="LIST", help="plan on a SLURM node list, e.g. 'gpu[01-04]'"
        )
        plan.add_argument("-o", "--output", choices=("text", "json"), default="text")
        plan.add_argument(
            "--launcher",
            choices=("process", "step", "agent"),
            help="show which launcher starts each instance with `srtr up --launcher` this "
            "(agent, the SLURM default with --nodelist: instances SLURM must set up keep "
            "their own step)",
        )
        plan.add_argument(
            "--against",
            metavar="RUN_DIR",
            help="print what applying the recipe to the job running in RUN_DIR would change",
        )
        plan.set_defaults(func=cmd_plan)

    schema = verbs.add_parser("schema", help="print the recipe's JSON Schema")
    schema.set_defaults(func=cmd_schema)

    if not run_verbs:
        return parser
    try:
        from srtr.cli import run as cli_run
    except ImportError:  # pragma: no cover - only during bootstrapping
        return parser
    cli_run.add_verbs(verbs)
    from srtr.cli import wait

    wait.add_verbs(verbs)
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
    if argv is None and args.func is cmd_plan:
        _exit_now(code)
    return code


def _exit_now(code: int) -> NoReturn:
    """End the process without tearing the interpreter down: ~50 M instructions (~18 ms) of
    freeing every module and, for a 1,000-node plan, 5,000 instance specs one by one, none of
    which a verb that only prints needs. Only from the console script (`argv` None): tests
    call `main` in-process. Nothing of `plan` registers atexit work; both streams are
    flushed here, where a closed reader is still quiet (`main`'s EPIPE handling)."""
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
