"""The base of every recipe model, and the field checks several of them share.

Split from `recipe.py` so that the probe and source models (`readiness.py`, `source.py`) and the
rest of the schema build on one base without importing each other.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")

PositiveSeconds = Annotated[float, Field(gt=0)]
# Far beyond any SLURM allocation, and small enough that a typo cannot make `srtr plan`
# build a billion-node allocation in memory.
MAX_NODES = 100_000


def _scalar_to_str(value: Any) -> Any:
    # YAML reads `PORT: 8000` and `["sleep", 1]` as numbers; users mean the text.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return getattr(value, "yaml_text", str(value))
    return value


Text = Annotated[
    str,
    BeforeValidator(_scalar_to_str),
    WithJsonSchema({"type": ["string", "number", "boolean"]}),
]


class Spec(BaseModel):
    """Base of every recipe model: frozen, unknown keys refused."""

    # strict: YAML's `yes` must not become 1 node, nor "8" a port; numbers stay numbers.
    # allow_inf_nan=False: YAML's `.nan` and `.inf` are floats to pydantic, and a NaN
    # timeout never expires (every comparison with it is false). Every float field of
    # every model refuses them.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def check_name(value: str, what: str) -> str:
    if not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if not NAME_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} may only contain letters, digits, '-' and '_' "
            "(it becomes file, step and env var names)"
        )
    return value


def check_argv(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if not value:
        raise ValueError("if set, must be non-empty (omit it to use the type's default)")
    if any(not part for part in value):
        raise ValueError("command/args must not contain empty arguments")
    return value


def check_port(value: int, what: str) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} must be between 1 and 65535; got {value}")
    return value


def check_env(v: dict[str, str]) -> dict[str, str]:
    # Every bad key at once: fixing one and running again to see the next wastes a turn.
    bad = [key for key in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)]
    if len(bad) == 1:
        raise ValueError(f"env key {bad[0]!r} is not a valid environment variable name")
    if bad:
        keys = ", ".join(repr(k) for k in bad)
        raise ValueError(f"env keys {keys} are not valid environment variable names")
    return v
