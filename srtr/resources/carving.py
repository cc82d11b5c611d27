"""Split an ordered allocation into dedicated, engine-worker, pool and spare nodes.

Order: dedicated nodes first (frontend/client share one: the last node when the client is
among them, else the first), then the engine roles' nodes, then each pool in `services:`
order. With pools, nodes left over are spares (for live growth and lost-node replacement);
without pools every non-reserved node is a worker node, as in srtctl (the order is its
order: docs/design/srtctl-parity.md, "Carving the allocation").
"""

from __future__ import annotations

from collections.abc import Sequence

from srtr.resources.effective import dedicated_roles, engine_node_count, pool_services, roles
from srtr.resources.objects import NodeMap, NodeSpec
from srtr.resources.recipe import Recipe, Service


class CarveError(ValueError):
    """The allocation cannot hold the recipe. `path` is the recipe field that asks for the
    node too many (a pool's `nodes`, a role's `nodes`), `("allocation",)` when none does."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ("allocation",)) -> None:
        super().__init__(message)
        self.path = path


class GrowNeeded(CarveError):
    """A live edit grows pools past the spare nodes and the recipe lets srtr ask for more
    (`resources.grow: live-edit`, within `resources.max_nodes`). The message is the refusal
    shown where nothing provisions nodes; `missing` is how many each pool still lacks, in
    carving order, for a caller that can request them."""

    def __init__(self, message: str, path: tuple[str | int, ...], missing: dict[str, int]) -> None:
        super().__init__(message, path)
        self.missing = missing

    @property
    def total(self) -> int:
        return sum(self.missing.values())


def _service_path(recipe: Recipe, name: str) -> tuple[str | int, ...]:
    index = next((i for i, s in enumerate(recipe.services) if s.name == name), None)
    return ("allocation",) if index is None else ("services", index, "nodes")


def _short_path(
    recipe: Recipe, free: int, engine: int, owners: Sequence[Service]
) -> tuple[str | int, ...]:
    """Where the recipe first asks for more than `free` nodes: roles first, then each pool
    in carving order (the carve order is also the order nodes are handed out)."""
    used = 0
    for name, role in roles(recipe):
        used += role.nodes
        if used > free:
            return ("roles", name, "nodes")
    for owner in owners:
        used += owner.nodes or 0
        if used > free:
            return _service_path(recipe, owner.name)
    return ("allocation",)


def carve(
    recipe: Recipe,
    allocation: Sequence[tuple[str, str]],
    previous: NodeMap | None = None,
    provisioned: frozenset[str] = frozenset(),
) -> NodeMap:
    """Carve `allocation` ((name, ip) pairs in allocation order) for `recipe`.

    With `previous` (a running job's carve), nodes stay where they are: see `recarve`.
    `provisioned`: the allocation's nodes that came from a grow request, not the main job.

    Raises:
        CarveError: too few nodes, in srtctl's words.
    """
    if previous is not None:
        return recarve(recipe, allocation, previous, provisioned)
    names = [name for name, _ in allocation]
    dedicated = dedicated_roles(recipe)
    reserved = _reserved(names, dedicated)
    remaining = [n for n in names if n not in reserved]
    owners = pool_services(recipe)
    engine = engine_node_count(recipe)
    need = engine + sum(s.nodes or 0 for s in owners) if owners else max(engine, 1)
    if len(remaining) < need:
        raise CarveError(
            f"allocation has {len(remaining)} non-reserved node(s) but the recipe needs {need}",
            _short_path(recipe, len(remaining), engine, owners),
        )
    workers, pools, spares = _split(remaining, engine, owners)
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
        allocation=_node_specs(allocation, workers, pools, reserved),
        workers=tuple(workers),
        pools=pools,
        reserved=tuple(reserved),
        spares=tuple(spares),
        head=head,
        bench=bench,
        # A dedicated etcd/nats takes the reserved node; else the discovery plane is on the head.
        infra=reserved[0] if "infra" in dedicated else head,
        role_nodes=role_nodes,
    )


def _reserved(names: list[str], dedicated: Sequence[str]) -> list[str]:
    """The node a dedicated frontend (first) or benchmark client (last) takes."""
    if not dedicated:
        return []
    if len(names) < 2:
        raise CarveError(f"dedicated node(s) for {'+'.join(dedicated)} require at least 2 nodes")
    return [names[-1] if "client" in dedicated else names[0]]


def _split(
    remaining: list[str], engine: int, owners: Sequence[Service]
) -> tuple[list[str], dict[str, tuple[str, ...]], list[str]]:
    """Engine workers first, then each pool in services order; the rest are spares."""
    if not owners:
        return remaining, {}, []
    pools: dict[str, tuple[str, ...]] = {}
    cursor = engine
    for owner in owners:
        count = owner.nodes or 0
        pools[owner.name] = tuple(remaining[cursor : cursor + count])
        cursor += count
    return remaining[:engine], pools, remaining[cursor:]


def _node_specs(
    allocation: Sequence[tuple[str, str]],
    workers: list[str],
    pools: dict[str, tuple[str, ...]],
    reserved: list[str],
    lost: Sequence[str] = (),
) -> tuple[NodeSpec, ...]:
    """Each node with its role: dedicated, else the first pool holding it, else worker/spare.

    One lookup table rather than a scan of every pool per node, which was quadratic in the
    allocation (a 4,096-node plan spent most of its carve there).
    """
    role: dict[str, str] = dict.fromkeys(workers, "worker")
    for name, members in reversed(pools.items()):  # the first pool wins, as it is set last
        role.update(dict.fromkeys(members, f"pool:{name}"))
    role.update(dict.fromkeys(reserved, "dedicated"))
    role.update(dict.fromkeys(lost, "lost"))
    return tuple(NodeSpec(name, ip, role.get(name, "spare")) for name, ip in allocation)


def recarve(
    recipe: Recipe,
    allocation: Sequence[tuple[str, str]],
    previous: NodeMap,
    provisioned: frozenset[str] = frozenset(),
) -> NodeMap:
    """Carve for a live edit: running instances never move.

    Dedicated and engine-role nodes stay as they are (a change there is refused). A pool that
    shrinks keeps its main-allocation nodes first and frees the `provisioned` ones first, so
    that they can go back to the provider (`releasable`); a pool that grows, and a new pool,
    take spare nodes in allocation order; a removed pool's nodes become spares.

    Raises:
        GrowNeeded: the pools need more nodes than are spare and the recipe allows growing.
        CarveError: the edit would move nodes, or needs more spares than there are and the
            recipe forbids growing or its `max_nodes` is reached.
    """
    names = [name for name, _ in allocation]
    _refuse_moves(recipe, previous)
    owners = pool_services(recipe)
    if not owners:
        return previous
    kept = {
        o.name: _kept(previous.pools.get(o.name, ()), o.nodes or 0, provisioned) for o in owners
    }
    used = set(previous.reserved) | set(previous.workers) | set(previous.lost)
    for members in kept.values():
        used.update(members)
    free = [n for n in names if n not in used]
    pools, free = _fill_pools(recipe, len(names), owners, kept, free)
    workers = list(previous.workers)
    reserved = list(previous.reserved)
    return NodeMap(
        allocation=_node_specs(allocation, workers, pools, reserved, previous.lost),
        workers=previous.workers,
        pools=pools,
        reserved=previous.reserved,
        spares=tuple(free),
        head=previous.head,
        bench=previous.bench,
        infra=previous.infra,
        role_nodes=previous.role_nodes,
        lost=previous.lost,
    )


def _refuse_moves(recipe: Recipe, previous: NodeMap) -> None:
    """A live edit may resize pools, never move the nodes everything else runs on."""
    if bool(dedicated_roles(recipe)) != bool(previous.reserved):
        raise CarveError("dedicated nodes cannot be added or removed while the job runs")
    engine = engine_node_count(recipe)
    if engine != sum(len(n) for n in previous.role_nodes.values()):
        raise CarveError("engine roles cannot change size while the job runs")
    owners = pool_services(recipe)
    if not owners and previous.pools:
        raise CarveError("the last pool cannot be removed while the job runs")
    if owners and not previous.pools:
        raise CarveError("pools cannot be added to a job that started without pools")


def _fill_pools(
    recipe: Recipe,
    allocated: int,
    owners: list[Service],
    kept: dict[str, tuple[str, ...]],
    free: list[str],
) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Each pool's kept nodes topped up from `free` in allocation order, and what is left.

    Raises GrowNeeded or CarveError (`grow_decision`) when the spares run out."""
    pools: dict[str, tuple[str, ...]] = {}
    missing: dict[str, int] = {}
    first_short: CarveError | None = None
    for owner in owners:
        want = (owner.nodes or 0) - len(kept[owner.name])
        if want > len(free) and first_short is None:
            first_short = CarveError(
                f"pool {owner.name} would grow past the allocation: it needs {want} more "
                f"node(s) and {len(free)} are spare",
                _service_path(recipe, owner.name),
            )
        if want > len(free):
            missing[owner.name] = want - len(free)
        pools[owner.name] = (*kept[owner.name], *free[:want])
        free = free[want:]
    if first_short is not None:
        raise grow_decision(recipe, allocated, missing, first_short)
    return pools, free


def _kept(members: tuple[str, ...], count: int, provisioned: frozenset[str]) -> tuple[str, ...]:
    """The `count` nodes a pool keeps: main-allocation nodes before provisioned ones, each in
    the pool's order (a shrink frees provisioned nodes first)."""
    if count >= len(members):
        return members
    ranked = sorted(range(len(members)), key=lambda i: (members[i] in provisioned, i))
    keep = sorted(ranked[:count])
    return tuple(members[i] for i in keep)


def grow_decision(
    recipe: Recipe, allocated: int, missing: dict[str, int], refusal: CarveError
) -> CarveError:
    """What a live edit short of `missing` nodes per pool gets, on a run of `allocated` nodes
    (the main allocation and every provisioned node): the grow request, or the refusal."""
    if recipe.resources.grow == "never":
        return refusal
    total = sum(missing.values())
    cap = recipe.resources.max_nodes
    if cap is not None and allocated + total > cap:
        return CarveError(
            f"{refusal}; growing needs {total} more node(s) but the run has {allocated} of "
            f"resources.max_nodes {cap}",
            refusal.path,
        )
    return GrowNeeded(str(refusal), refusal.path, missing)


def releasable(nodes: NodeMap, provisioned: frozenset[str]) -> tuple[str, ...]:
    """The provisioned nodes a carve left idle (spares), in allocation order: what a shrink
    gives back to the provider. Main-allocation nodes stay, as spares."""
    return tuple(n for n in nodes.spares if n in provisioned)


def without(nodes: NodeMap, names: Sequence[str]) -> NodeMap:
    """`nodes` after the spare nodes `names` went back to their provider: they leave the
    allocation (only spares can: nothing runs there).

    Raises:
        ValueError: one of `names` is not a spare node.
    """
    gone = set(names)
    busy = sorted(gone - set(nodes.spares))
    if busy:
        raise ValueError(f"only spare nodes can leave the allocation, not {', '.join(busy)}")
    return NodeMap(
        allocation=tuple(n for n in nodes.allocation if n.name not in gone),
        workers=nodes.workers,
        pools=nodes.pools,
        reserved=nodes.reserved,
        spares=tuple(n for n in nodes.spares if n not in gone),
        head=nodes.head,
        bench=nodes.bench,
        infra=nodes.infra,
        role_nodes=nodes.role_nodes,
        lost=nodes.lost,
    )
