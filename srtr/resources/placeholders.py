"""`{key}` substitution into argv elements, env values and preamble text (reference §5).

Literal replacement of known keys only: any other braces (JSON in an env value, `${HOME}`,
an unknown `{foo}`) are left exactly as written, and no shell is ever involved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_KEY = re.compile(r"\{([a-z_]+)\}")

KEYS = (
    "node",
    "node_ip",
    "node_id",
    "index",
    "role",
    "head_node",
    "head_ip",
    "infra_node",
    "infra_ip",
    "pool_node",
    "pool_ip",
    "pool_nodes",
    "pool_ips",
    "pool_node_count",
    "gpus_per_node",
    "job_name",
)


def render(text: str, values: Mapping[str, str]) -> str:
    """Replace each `{key}` whose key is in `values`; leave everything else untouched."""
    if "{" not in text:
        return text
    return _KEY.sub(lambda m: values.get(m.group(1), m.group(0)), text)
