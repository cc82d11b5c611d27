"""Recipe file → validated `Recipe`, or a `RecipeError` listing every problem with its line.

Called by the CLI (plan, up) and by the live-edit watcher. Three stages, each reporting all
it finds: YAML (syntax, size, duplicate keys), schema (pydantic, with did-you-mean for unknown
keys), and whole-recipe rules (`rules.py`).
"""

from __future__ import annotations

import difflib
import re
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


def read_text(path: str | FilePath) -> str:
    """The recipe's text. Raises RecipeError when it cannot be read."""
    try:
        raw = FilePath(path).read_bytes()
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


def load_file(path: str | FilePath) -> Recipe:
    """Read and validate a recipe file. Raises RecipeError (never anything else for bad input)."""
    return load_text(read_text(path), str(path))


def load_text(text: str, file: str = "recipe.yaml") -> Recipe:
    """Validate recipe text; `file` only names it in messages."""
    recipe, _ = load_marked(text, file)
    return recipe


def default_name(file: str) -> str:
    """The name of a recipe without `name:`: its file's stem, made a valid name.

    `pools.yaml` → `pools`; `my sft run.yml` → `my-sft-run` (srtctl's recipes carry no name:
    the file names the job).
    """
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", FilePath(file).stem).strip("-")
    return name or "recipe"


def load_marked(
    text: str, file: str = "recipe.yaml", *, name: str | None = None
) -> tuple[Recipe, Marked]:
    """Like load_text, and also return the line marks (for problems found later, in expand).

    Without `name:` in the text, the recipe is named `name`, or after `file` (default_name).
    """
    try:
        marked = parse(text)
    except YamlProblem as exc:
        raise RecipeError(file, [Problem((), exc.message, line=exc.line)]) from None
    if isinstance(marked.data, dict) and "name" not in marked.data:
        marked.data["name"] = name or default_name(file)
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
    model_loc: Path = tuple(err["loc"])
    loc = _as_written(model_loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        message = f"unknown key '{key}'"
        allowed = _fields_at(model_loc[:-1])
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
        message = _our_words(loc, kind, err)
        if "input" in err and kind not in ("model_type", "dict_type", "list_type"):
            message += f"; got {err['input']!r}"
            if isinstance(err["input"], bool) and kind.startswith(("string", "int")):
                message += f" ({BOOL_HINT})"
    return Problem(loc, _strip_path_echo(loc, message), marked.line_of(loc))


# pydantic's messages ("Input should be a valid list") in the words of srtr's own rules
# ("must be ..."), so that one recipe's problems read alike. Unknown kinds keep pydantic's.
_MUST = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "dict_type": "must be a mapping (key: value)",
    "list_type": "must be a list",
    "model_type": "must be a mapping (key: value)",
    "finite_number": "must be a finite number (.nan and .inf are not accepted)",
}
_BOUND = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
}
_ARGV = ("command", "args", "build_command")
ARGV_HINT = (
    'an argv list like ["python", "serve.py"], never run by a shell (shell text goes in `preamble`)'
)
SHELL_HINT = "shell text, one string (an argv list goes in `command`)"


def _our_words(loc: Path, kind: str, err: Any) -> str:
    field = loc[-1] if loc else ""
    shell = field == "preamble" or (field == "command" and "benchmark" in loc)
    if kind == "list_type" and field in _ARGV and not shell:
        given = err.get("input")
        if isinstance(given, str):
            return f"must be {ARGV_HINT}; got {given!r}: {_as_argv(given)}"
        return f"must be {ARGV_HINT}"
    if kind == "string_type" and shell:
        return f"must be {SHELL_HINT}"
    if kind in _MUST:
        return _MUST[kind]
    ctx = err.get("ctx") or {}
    if kind in _BOUND:
        bound = next(iter(ctx.values()), "?")
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # `>= 0`, not `>= 0.0`, for a float field
        return f"must be {_BOUND[kind]} {bound}"
    if kind == "literal_error" and "expected" in ctx:
        return f"must be one of {ctx['expected']}"
    return str(err["msg"])


def _as_argv(text: str) -> str:
    """`sleep 1000` → `write ["sleep", "1000"]` (or preamble, for what needs a shell)."""
    import json
    import shlex

    try:
        words = shlex.split(text)
    except ValueError:
        words = []
    if words and not any(c in text for c in "|&;<>$`*?(){}"):
        return f"write {json.dumps(words)}"
    return 'write ["bash", "-c", ...], or put the shell text in `preamble`'


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


def _as_written(loc: Path) -> Path:
    """A model path as the recipe spells it: an autoscaled pool's `nodes: {min, max, from}`
    is the model's `autoscale` (and `from` its `source`)."""
    if len(loc) >= 3 and loc[0] == "services" and loc[2] == "autoscale":
        rest = tuple("from" if part == "source" else part for part in loc[3:4]) + loc[4:]
        return (*loc[:2], "nodes", *rest)
    return loc


def _fields_at(loc: Path) -> list[str]:
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _unwrap(field.annotation) if field else None
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items() if name != "autoscale"]
