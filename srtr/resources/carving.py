"""Split an ordered allocation into dedicated, engine-worker, pool and spare nodes (§3).

Order: dedicated nodes first (frontend/client share one: the last node when the client is
among them, else the first), then the engine roles' nodes, then each pool in `services:`
order. With pools, nodes left over are spares (for live growth and lost-node replacement);
without pools every non-reserved node is a worker node, as in the older system.
"""

from __future__ import annotations

from collections.abc import Sequence

from srtr.resources.effective import dedicated_roles, engine_node_count, pool_services, roles
from srtr.resources.objects import NodeMap, NodeSpec
from srtr.resources.recipe import Recipe


class CarveError(ValueError):
    """The allocation cannot hold the recipe."""


def carve(recipe: Recipe, allocation: Sequence[tuple[str, str]]) -> NodeMap:
    """Carve `allocation` ((name, ip) pairs in allocation order) for `recipe`.

    Raises:
        CarveError: too few nodes, with the exact message of design.md.
    """
    names = [name for name, _ in allocation]
    dedicated = dedicated_roles(recipe)
    reserved: list[str] = []
    if dedicated:
        if len(names) < 2:
            raise CarveError(
                f"dedicated node(s) for {'+'.join(dedicated)} require at least 2 nodes"
            )
        reserved = [names[-1] if "client" in dedicated else names[0]]
    remaining = [n for n in names if n not in reserved]
    owners = pool_services(recipe)
    engine = engine_node_count(recipe)
    need = engine + sum(s.nodes or 0 for s in owners) if owners else max(engine, 1)
    if len(remaining) < need:
        raise CarveError(
            f"allocation has {len(remaining)} non-reserved node(s) but the recipe needs {need}"
        )
    pools: dict[str, tuple[str, ...]] = {}
    if owners:
        workers = remaining[:engine]
        cursor = engine
        for owner in owners:
            count = owner.nodes or 0
            pools[owner.name] = tuple(remaining[cursor : cursor + count])
            cursor += count
        spares = remaining[cursor:]
    else:
        workers, spares = remaining, []
    role_nodes: dict[str, tuple[str, ...]] = {}
    cursor = 0
    for name, role in roles(recipe):
        role_nodes[name] = tuple(workers[cursor : cursor + role.nodes])
        cursor += role.nodes
    if reserved:
        first_pool = next((p[0] for p in pools.values() if p), None)
        first_compute = workers[0] if workers else (first_pool or remaining[0])
        head = reserved[0] if "frontend" in dedicated else first_compute
        bench = reserved[0] if "client" in dedicated else head
    else:
        head = bench = names[0]
    return NodeMap(
        allocation=tuple(
            NodeSpec(name, ip, _role_of(name, workers, pools, reserved)) for name, ip in allocation
        ),
        workers=tuple(workers),
        pools=pools,
        reserved=tuple(reserved),
        spares=tuple(spares),
        head=head,
        bench=bench,
        infra=head,
        role_nodes=role_nodes,
    )


def _role_of(
    node: str, workers: list[str], pools: dict[str, tuple[str, ...]], reserved: list[str]
) -> str:
    if node in reserved:
        return "dedicated"
    for name, members in pools.items():
        if node in members:
            return f"pool:{name}"
    return "worker" if node in workers else "spare"
