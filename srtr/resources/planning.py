"""Recipe file + allocation → (Recipe, DesiredState), with every problem tied to a line.

The one entry point the CLI and the live-edit watcher use to turn a file into desired state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from srtr.resources import health_rules, placeholder_lint
from srtr.resources.autoscale import with_sizes
from srtr.resources.effective import allocation_size
from srtr.resources.errors import GrowRequired, RecipeError
from srtr.resources.expand import ExpandError, ExpandGrow, expand, local_allocation
from srtr.resources.loading import attach_line, load_marked, read_text
from srtr.resources.objects import DesiredState, NodeMap
from srtr.resources.pins import Pins, apply_pins
from srtr.resources.recipe import Recipe


def plan_text_source(
    text: str,
    file: str,
    allocation: Sequence[tuple[str, str]] | None = None,
    previous: NodeMap | None = None,
    *,
    name: str | None = None,
    pins: Pins | None = None,
    provisioned: frozenset[str] = frozenset(),
    sizes: Mapping[str, int] | None = None,
) -> tuple[Recipe, DesiredState]:
    """Validate and expand. Without an allocation, plan on the smallest local one that fits.

    `name` names a recipe that has no `name:` (default: after `file`). `pins` are the job's
    source pins (resources/pins.py): every planning of a job's recipe passes the same ones.
    `provisioned`: the allocation's nodes that a grow request brought (`carving.carve`).
    `sizes`: the autoscaled pools' sizes now (`autoscale.with_sizes`); default: their `min`.

    Raises:
        GrowRequired: a live edit needs more nodes than are spare, and may ask for them.
        RecipeError: every problem, as `file:line: path: message`.
    """
    recipe, marked = load_marked(text, file, name=name)
    recipe = apply_pins(recipe, pins or {})
    if sizes:
        recipe = with_sizes(recipe, sizes)
    if allocation is None:
        allocation = local_allocation(allocation_size(recipe))
    try:
        state = expand(recipe, allocation, previous, provisioned)
    except ExpandGrow as exc:
        problems = [attach_line(p, marked) for p in exc.problems]
        raise GrowRequired(file, problems, exc.missing) from None
    except ExpandError as exc:
        raise RecipeError(file, [attach_line(p, marked) for p in exc.problems]) from None
    lints = [*placeholder_lint.warnings(recipe), *health_rules.warnings(recipe)]
    found = sorted((attach_line(p, marked) for p in lints), key=lambda p: p.line)
    typos = [p.format(file) for p in found]
    if typos:
        state = dataclasses.replace(state, line_warnings=tuple(typos))
    return recipe, state


def plan_file(
    path: str | Path, allocation: Sequence[tuple[str, str]] | None = None
) -> tuple[Recipe, DesiredState]:
    return plan_text_source(read_text(path), str(path), allocation)
