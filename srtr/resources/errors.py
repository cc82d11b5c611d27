"""Recipe problems and their one-line form `FILE:LINE: path: message`.

Every bad input srtr can be given ends up as a `RecipeError`; the CLI prints its lines and
exits 2. Nothing here knows about YAML or pydantic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Path = tuple[str | int, ...]
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


def format_path(path: Path) -> str:
    """`("services", 2, "placement", "pool")` → `services[2].placement.pool`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _PLAIN.fullmatch(part):
            out += f"[{part!r}]"  # a key with spaces or newlines must not break the line
        else:
            out += f".{part}" if out else part
    return out


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe. `line` is 0 when unknown."""

    path: Path
    message: str
    line: int = 0
    warning: bool = False

    def format(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        # One problem, one line: a multi-line message would break `FILE:LINE:` parsing.
        message = " ".join(self.message.split())
        dotted = format_path(self.path)
        prefix = "warning: " if self.warning else ""
        return (
            f"{where}: {prefix}{dotted}: {message}" if dotted else (f"{where}: {prefix}{message}")
        )


class RecipeError(Exception):
    """A recipe that cannot be run, with every problem found in it."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        return [p.format(self.file) for p in self.problems]


class GrowRequired(RecipeError):
    """A live edit is valid but its pools need `missing` more nodes (per pool) than are
    spare, and the recipe lets srtr ask for them (`resources.grow: live-edit`). Where
    nothing provisions nodes it is refused like any other RecipeError."""

    def __init__(self, file: str, problems: list[Problem], missing: dict[str, int]) -> None:
        super().__init__(file, problems)
        self.missing = missing

    @property
    def total(self) -> int:
        return sum(self.missing.values())
