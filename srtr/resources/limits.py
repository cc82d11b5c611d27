"""`limits:` of a service: what one instance may use, in Kubernetes' quantity syntax.

`limits: {memory: 512Mi}` caps each instance's memory (the backends put it in a memory
cgroup of its own; with the step launcher srun also gets `--mem`). A quantity is a plain
number of bytes or one with a suffix: decimal `k`, `M`, `G`, `T`, `P`, `E` (powers of
1000) or binary `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` (powers of 1024), as Kubernetes writes
them (`1.5Gi` too). Pure: no cgroups here, only the numbers.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

SUFFIXES = {
    "": 1,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "E": 1000**6,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>[A-Za-z]*)")
# Less than this cannot even start an interpreter: surely a missing suffix (`512`).
MIN_MEMORY = 1024**2


def parse_quantity(text: str) -> int:
    """`512Mi` → 536870912 bytes. Raises ValueError with the user's words."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None or match["suffix"] not in SUFFIXES:
        raise ValueError(
            f"{text!r} is not a quantity: a number of bytes, or one with a suffix "
            "(Ki, Mi, Gi, Ti; k, M, G, T), like 512Mi or 2G"
        )
    try:
        value = Decimal(match["number"]) * SUFFIXES[match["suffix"]]
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{text!r} is not a quantity") from None
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def format_bytes(count: int) -> str:
    """`536870912` → `512Mi`: the largest binary suffix that divides it, else bytes."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if count % SUFFIXES[suffix] == 0:
            return f"{count // SUFFIXES[suffix]}{suffix}"
    return str(count)


def _memory(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("memory must be a quantity like 512Mi or 2G, or a number of bytes")
    count = value if isinstance(value, int) else parse_quantity(value)
    if count < MIN_MEMORY:
        raise ValueError(
            f"memory must be at least 1Mi; got {value!r} ({count} bytes): "
            "a plain number is bytes, write 512Mi for 512 MiB"
        )
    return count


Memory = Annotated[
    int,
    BeforeValidator(_memory),
    WithJsonSchema({"type": ["string", "integer"], "examples": ["512Mi", "2G"]}),
]


class Limits(BaseModel):
    """`limits:` of a service (per instance)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    memory: Memory | None = None
