"""The run dir's source pins for `up` and `submit` (resources/pins.py says why).

A new job's pins are decided here, once, before anything is allocated: those `srtr submit`
left in the run dir are kept, the rest resolved with `git ls-remote`. Later plannings of the
job (adoption, `plan --against`, live edits, node replacement) only read them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from srtr.resources.errors import Problem, RecipeError
from srtr.resources.pins import PINS_FILE, Pin, Pins, parse_pins, pins_json, unpinned
from srtr.resources.recipe import Recipe


def read_pins(run_dir: Path) -> dict[str, Pin]:
    """The pins in `run_dir` ({} when it has none)."""
    path = run_dir / PINS_FILE
    try:
        return parse_pins(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        problem = Problem((), f"cannot read the job's source pins: {exc}")
        raise RecipeError(str(path), [problem]) from None


def decide_pins(recipe: Recipe, text: str, file: str, known: Pins) -> dict[str, Pin]:
    """`known` and a pin for every other source of `recipe` (loaded from `text`) whose rev
    is not a commit.

    Raises:
        RecipeError: a rev that does not resolve, at its `services[i].source.rev` line.
    """
    missing = unpinned(recipe, known)
    if not missing:
        return dict(known)
    from srtr.net import git_refs

    print("srtr: pinning source revs (git ls-remote)...", file=sys.stderr)
    return {**known, **git_refs.pin_services(missing, text, file)}


def write_pins(run_dir: Path, pins: Pins) -> None:
    """Record the job's pins in its (created) run dir; a job without any writes no file."""
    from srtr.store.persist import write_atomic

    if pins:
        write_atomic(run_dir / PINS_FILE, pins_json(pins))
