"""`srtr plan` (and its alias `dry-run`) and `srtr schema`: the verbs that only plan.

Their imports (pydantic, the recipe model) stay in their functions: every other verb
builds these parsers too, and `srtr status` from a login node must not pay for them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from srtr.cli.errors import bad
from srtr.cli.parser import positive_int
from srtr.resources.errors import Problem, RecipeError

PLAN_VERBS = ("plan", "dry-run")


def add_verbs(verbs: Any) -> None:
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
            type=positive_int,
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

    from srtr.resources.diff import diff, render
    from srtr.resources.loading import read_text
    from srtr.resources.objects import NodeMap
    from srtr.resources.planning import plan_text_source
    from srtr.runtime.pins import read_pins
    from srtr.store.rundir import StateFileError, read_state

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
