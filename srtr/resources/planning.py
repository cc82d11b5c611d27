"""Recipe file + allocation → (Recipe, DesiredState), with every problem tied to a line.

The one entry point the CLI and the live-edit watcher use to turn a file into desired state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from srtr.resources.effective import allocation_size
from srtr.resources.errors import RecipeError
from srtr.resources.expand import ExpandError, expand, local_allocation
from srtr.resources.loading import MAX_RECIPE_BYTES, attach_line, load_marked
from srtr.resources.objects import DesiredState, NodeMap
from srtr.resources.recipe import Recipe


def read_text(path: str | Path) -> str:
    """The recipe's text. Raises RecipeError when it cannot be read."""
    from srtr.resources.errors import Problem

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RecipeError(
            str(path), [Problem((), f"cannot read the recipe: {exc.strerror}")]
        ) from None
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError(str(path), [Problem((), "the recipe is larger than 4 MiB")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            str(path), [Problem((), f"the recipe is not UTF-8 text: {exc}")]
        ) from None


def plan_text_source(
    text: str,
    file: str,
    allocation: Sequence[tuple[str, str]] | None = None,
    previous: NodeMap | None = None,
) -> tuple[Recipe, DesiredState]:
    """Validate and expand. Without an allocation, plan on the smallest local one that fits.

    Raises:
        RecipeError: every problem, as `file:line: path: message`.
    """
    recipe, marked = load_marked(text, file)
    if allocation is None:
        allocation = local_allocation(allocation_size(recipe))
    try:
        return recipe, expand(recipe, allocation, previous)
    except ExpandError as exc:
        raise RecipeError(file, [attach_line(p, marked) for p in exc.problems]) from None


def plan_file(
    path: str | Path, allocation: Sequence[tuple[str, str]] | None = None
) -> tuple[Recipe, DesiredState]:
    return plan_text_source(read_text(path), str(path), allocation)
