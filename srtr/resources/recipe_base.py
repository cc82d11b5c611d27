"""What every recipe model is built from: the frozen, strict base model and the text type.

Split from `recipe.py` so that the models of one block (`liveness.py`) can live in a module
of their own that `recipe.py` imports.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema


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


def check_port(value: int, what: str) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} must be between 1 and 65535; got {value}")
    return value
