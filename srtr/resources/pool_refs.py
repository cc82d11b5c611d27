"""Another pool's addresses: `{pool_ip:NAME}`, `{pool_ips:NAME}`, `{pool_node:NAME}`,
`{pool_nodes:NAME}` and `{pool_node_count:NAME}`.

`{pool_ip}` and its kin are the instance's own pool's; a scheduler in one pool and its
workers in another need the scheduler pool's instance 0 instead. NAME is an owner (a service
with `nodes`) of the recipe: anything else is refused when the recipe is checked, with the
list of pools, since a silently unrendered address would only fail at rendezvous.

Only the references a recipe writes get values (`wanted`): every instance's placeholder
values are copied per node, and a 1,000-node plan must not carry every pool's lists in each.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from srtr.resources.errors import Path, Problem

# The own-pool placeholder each one stands for, with another pool's name after a colon.
POOL_KEYS = ("pool_ip", "pool_ips", "pool_node", "pool_nodes", "pool_node_count")
_REF = re.compile(r"\{(" + "|".join(POOL_KEYS) + r"):([^{}:\s]*)\}")

Ref = tuple[str, str]  # (key, pool name)


def refs(text: str) -> list[Ref]:
    """Every `{pool_*:NAME}` in `text`, in order."""
    if ":" not in text or "{" not in text:
        return []
    return [(m.group(1), m.group(2)) for m in _REF.finditer(text)]


def wanted(texts: Iterable[tuple[Path, str]]) -> frozenset[Ref]:
    return frozenset(ref for _, text in texts for ref in refs(text))


def check(texts: Iterable[tuple[Path, str]], owners: Sequence[str]) -> list[Problem]:
    """A problem for each reference to a name that owns no pool."""
    known = set(owners)
    listed = ", ".join(sorted(owners)) or "none"
    out = []
    for path, text in texts:
        for key, name in refs(text):
            if name not in known:
                out.append(
                    Problem(
                        path,
                        f"{{{key}:{name}}} names no pool: '{name}' is not a service that "
                        f"declares nodes (pools: {listed})",
                    )
                )
    return out


def values(
    found: Iterable[Ref], pools: Mapping[str, Sequence[str]], ips: Mapping[str, str]
) -> Iterator[tuple[str, str]]:
    """(placeholder key, value) for each reference, from the carve's pools and node IPs;
    each once as written (`render`) and once as a format field (`template`)."""
    for key, name in found:
        members = pools.get(name, ())
        if not members:  # a pool of no nodes has no address; left as written
            continue
        text = _value(key, members, ips)
        yield f"{key}:{name}", text
        yield f"{key}@{name}", text


def _value(key: str, members: Sequence[str], ips: Mapping[str, str]) -> str:
    if key == "pool_ip":
        return ips[members[0]]
    if key == "pool_ips":
        return ",".join(ips[n] for n in members)
    if key == "pool_node":
        return members[0]
    if key == "pool_nodes":
        return ",".join(members)
    return str(len(members))
