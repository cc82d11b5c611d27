"""Recipe file → validated `Recipe`, or a `RecipeError` listing every problem with its line.

Called by the CLI (plan, up) and by the live-edit watcher. Three stages, each reporting all
it finds: YAML (syntax, size, duplicate keys), schema (pydantic, with did-you-mean for unknown
keys), and whole-recipe rules (`rules.py`).
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path as FilePath
from typing import Any

from pydantic import BaseModel, ValidationError

from srtr.resources import rules
from srtr.resources.errors import Path, Problem, RecipeError
from srtr.resources.recipe import Recipe
from srtr.resources.yamlmarks import BOOL_HINT, Marked, YamlProblem, parse

MAX_RECIPE_BYTES = 4 * 1024 * 1024


def load_file(path: str | FilePath) -> Recipe:
    """Read and validate a recipe file. Raises RecipeError (never anything else for bad input)."""
    from srtr.resources.planning import read_text

    return load_text(read_text(path), str(path))


def load_text(text: str, file: str = "recipe.yaml") -> Recipe:
    """Validate recipe text; `file` only names it in messages."""
    recipe, _ = load_marked(text, file)
    return recipe


def load_marked(text: str, file: str = "recipe.yaml") -> tuple[Recipe, Marked]:
    """Like load_text, and also return the line marks (for problems found later, in expand)."""
    try:
        marked = parse(text)
    except YamlProblem as exc:
        raise RecipeError(file, [Problem((), exc.message, line=exc.line)]) from None
    try:
        recipe = Recipe.model_validate(marked.data)
    except ValidationError as exc:
        problems = [_problem_from(err, marked) for err in exc.errors()]
        raise RecipeError(file, _sorted(problems)) from None
    problems = [attach_line(p, marked) for p in rules.check(recipe)]
    if problems:
        raise RecipeError(file, _sorted(problems))
    return recipe, marked


def attach_line(problem: Problem, marked: Marked) -> Problem:
    return Problem(problem.path, problem.message, marked.line_of(problem.path), problem.warning)


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: p.line)


def _problem_from(err: Any, marked: Marked) -> Problem:
    loc: Path = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        message = f"unknown key '{key}'"
        allowed = _fields_at(loc[:-1])
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if close:
            message += f" (did you mean '{close[0]}'?)"
        elif allowed:
            message += f"; allowed: {', '.join(allowed)}"
        return Problem(loc, message, marked.line_of(loc))
    if kind == "missing":
        return Problem(loc, "is required", marked.line_of(loc))
    if kind == "value_error":
        message = str(err["ctx"]["error"])
    else:
        message = err["msg"]
        if "input" in err and kind not in ("model_type", "dict_type", "list_type"):
            message += f"; got {err['input']!r}"
            if isinstance(err["input"], bool) and kind.startswith(("string", "int")):
                message += f" ({BOOL_HINT})"
    return Problem(loc, _strip_path_echo(loc, message), marked.line_of(loc))


def _strip_path_echo(loc: Path, message: str) -> str:
    # Field validators name their field ("readiness.tcp.port must be ...") so their messages
    # read well on their own; next to the full path that would say it twice.
    for start in range(len(loc)):
        words = [p for p in loc[start:] if isinstance(p, str)]
        echo = ".".join(words) + " "
        if words and message.startswith(echo):
            return message[len(echo) :]
    return message


def _unwrap(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X | None`, `list[X]`, `Annotated[X, ...]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is None:
        return None
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _unwrap(args[0])
    if origin in (typing.Union, types.UnionType, list):
        for arg in args:
            found = _unwrap(arg)
            if found is not None:
                return found
    return None


def _fields_at(loc: Path) -> list[str]:
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _unwrap(field.annotation) if field else None
    return list(model.model_fields) if model else []
