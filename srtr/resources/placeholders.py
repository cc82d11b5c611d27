"""`{key}` substitution into argv elements, env values and preamble text.

Literal replacement of known keys only: any other braces (JSON in an env value, `${HOME}`,
an unknown `{foo}`) are left exactly as written, and no shell is ever involved.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

# `{key}`, or `{key:NAME}` for another pool's address (pool_refs.py).
_KEY = re.compile(r"\{([a-z_]+(?::[A-Za-z0-9_-]+)?)\}")

KEYS = (
    "node",
    "node_ip",
    "listen_ip",
    "listen_host",
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


@functools.lru_cache(maxsize=4096)
def _parts(text: str) -> tuple[str, ...]:
    # literal, key, literal, key, ..., literal: split once per distinct text, not per instance
    # (`expand` renders the same few texts for every node of a pool).
    return tuple(_KEY.split(text))


def render(text: str, values: Mapping[str, str]) -> str:
    """Replace each `{key}` whose key is in `values`; leave everything else untouched."""
    if "{" not in text:
        return text
    parts = _parts(text)
    if len(parts) == 1:
        return text
    out = [parts[0]]
    for i in range(1, len(parts), 2):
        value = values.get(parts[i])
        out.append("{" + parts[i] + "}" if value is None else value)
        out.append(parts[i + 1])
    return "".join(out)


def named(text: str) -> tuple[str, ...]:
    """The keys `text` names, known or not (`{pool_ip:NAME}` as `pool_ip:NAME`)."""
    return _parts(text)[1::2] if "{" in text else ()


def field_name(key: str) -> str:
    """`key` as a `str.format_map` field: `pool_ip:NAME` → `pool_ip@NAME`."""
    return key.replace(":", "@")


@functools.lru_cache(maxsize=4096)
def template(text: str, keys: frozenset[str]) -> str | None:
    """`text` as a `str.format_map` template, or None when it names none of `keys`.

    For any `values` holding every one of `keys`, `template(text, keys).format_map(values)`
    equals `render(text, values)`: other braces are escaped, so they stay as written. `expand`
    compiles each text once per service and fills it in per node, which is several times
    faster than `render` for a 1,000-node pool.
    """
    parts = _parts(text) if "{" in text else (text,)
    if not any(parts[i] in keys for i in range(1, len(parts), 2)):
        return None
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(part.replace("{", "{{").replace("}", "}}"))
        elif part in keys:
            # `format_map` would read `{pool_ip:x}` as a format spec: the values carry such
            # a key under `field_name` too.
            out.append("{" + field_name(part) + "}")
        else:
            out.append("{{" + part + "}}")
    return "".join(out)
