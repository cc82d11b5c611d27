"""The count an autoscaled pool's instance 0 publishes, parsed (stdlib only: the prober that
reads it is imported by the node agent, which must stay light)."""

from __future__ import annotations

import json


def parse_count(text: str) -> int:
    """The published count: a whole number (`8`, `8\\n`), or JSON `{"desired": 8}`.

    Raises:
        ValueError: anything else, or a count below 0.
    """
    stripped = text.strip()
    try:
        value: object = int(stripped)
    except ValueError:
        try:
            data = json.loads(stripped)
        except ValueError:
            raise ValueError(f"not a node count: {stripped[:40]!r}") from None
        value = data.get("desired") if isinstance(data, dict) else data
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"not a node count: {stripped[:40]!r}")
    if value < 0:
        raise ValueError(f"a node count cannot be negative: {value}")
    return value
