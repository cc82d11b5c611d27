"""Property tests of the plan: random valid recipes carve and place correctly, and random
broken recipes fail only with srtr's own errors.

Recipes are built as dicts (0-3 engine roles, 0-4 owners of 1-4 nodes, 0-3 riders on random
owners, 0-3 services on head/workers/compute/all or a role, optional dedicated frontend and
client nodes, optional implied exporters), dumped to YAML and loaded like a file. Each is
planned on exactly `allocation_size` nodes and on a few more.

More examples:
    SRTR_HYPOTHESIS_EXAMPLES=2000 python3 -m pytest tests/resources/test_plan_properties.py
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srtr.resources.effective import (
    allocation_size,
    effective_placement,
    effective_pool,
    effective_services,
    engine_node_count,
    is_rider,
    pool_services,
)
from srtr.resources.errors import RecipeError
from srtr.resources.expand import PHASE_ORDER, ExpandError, expand, local_allocation
from srtr.resources.loading import load_text
from srtr.resources.objects import DesiredState, InstanceKind
from srtr.resources.recipe import Recipe

SCALE = int(os.environ.get("SRTR_HYPOTHESIS_EXAMPLES", "0"))
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def examples(default: int) -> int:
    return SCALE or default


ROLE_NAMES = ("prefill", "decode", "agg")
PHASES = ("infra", "before_workers", "after_frontend")


@st.composite
def recipe_dicts(draw: st.DrawFn, ports: bool = False) -> dict[str, Any]:
    """A valid recipe; with `ports`, services get readiness ports that may collide."""
    d: dict[str, Any] = {"name": "prop", "resources": {"gpus_per_node": 8}}
    roles: dict[str, Any] = {}
    for name in ROLE_NAMES:
        if draw(st.booleans()):
            role: dict[str, Any] = {"nodes": draw(st.integers(1, 3))}
            if draw(st.booleans()):
                role["command"] = ["worker", "--rank={index}", "--at={node_ip}"]
                role["workers"] = draw(st.integers(1, 4))
            roles[name] = role
    if roles:
        d["roles"] = roles

    services: list[dict[str, Any]] = []
    owners = [f"own{k}" for k in range(draw(st.integers(0, 4)))]
    for name in owners:
        owner: dict[str, Any] = {
            "name": name,
            "command": ["sleep", "1"],
            "nodes": draw(st.integers(1, 4)),
        }
        if draw(st.booleans()):
            owner["placement"] = {"node": "workers"}
        if draw(st.booleans()):
            owner["start"] = draw(st.sampled_from(PHASES))
        if ports and draw(st.booleans()):
            owner["readiness"] = {"port": draw(st.sampled_from([9000, 9001]))}
        services.append(owner)
    if owners:
        for k in range(draw(st.integers(0, 3))):
            services.append(
                {
                    "name": f"ride{k}",
                    "command": ["agent", "{pool_ip}", "{index}"],
                    "placement": {"pool": draw(st.sampled_from(owners))},
                }
            )
    for k in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["head", "workers", "compute", "all", *roles]))
        service: dict[str, Any] = {
            "name": f"svc{k}",
            "command": ["svc", "{node}"],
            "placement": {"node": where},
        }
        if draw(st.booleans()):
            service["start"] = draw(st.sampled_from(PHASES))
        if ports and draw(st.booleans()):
            service["readiness"] = {"tcp": {"port": draw(st.sampled_from([9000, 9001]))}}
        services.append(service)
    services = draw(st.permutations(services))  # riders may come before their owner
    if services:
        d["services"] = services

    if roles:
        frontend: dict[str, Any] = {}
        if draw(st.booleans()):
            frontend["type"] = "generic"
        if draw(st.booleans()):
            frontend["command"] = ["router", "{head_ip}"]
        if draw(st.booleans()):
            frontend["dedicated_node"] = True
        if frontend:
            d["frontend"] = frontend
    elif draw(st.booleans()):
        d["frontend"] = {"type": "none"}

    benchmark: dict[str, Any] = {}
    if draw(st.booleans()):
        benchmark = {"type": "custom", "command": "echo $SRT_WORKER_NODES"}
    if draw(st.booleans()):
        benchmark["client_dedicated_node"] = True
    if benchmark:
        d["benchmark"] = benchmark
    if draw(st.booleans()):
        d["observability"] = {"exporters": True}
    return d


def load(d: dict[str, Any]) -> Recipe:
    return load_text(yaml.safe_dump(d, sort_keys=False))


def expected_nodes(recipe: Recipe, state: DesiredState, service_name: str) -> list[str]:
    """Where a service's instances belong, straight from the node map."""
    nodes = state.nodes
    service = next(s for s, _ in effective_services(recipe) if s.name == service_name)
    pool = effective_pool(service)
    if pool is not None:
        return list(nodes.pools[pool])
    where = effective_placement(service)
    if where == "head":
        return [nodes.head]
    if where == "workers":
        return list(nodes.workers)
    if where == "compute":
        return list(nodes.compute)
    if where == "all":
        return list(dict.fromkeys([nodes.head, nodes.infra, nodes.bench, *nodes.compute]))
    return list(nodes.role_nodes.get(where, ()))


def check_plan(recipe: Recipe, state: DesiredState, size: int, extra: int) -> None:
    nodes = state.nodes
    names = [n.name for n in nodes.allocation]
    assert len(names) == size + extra

    # instance names are unique and every instance sits on a node of the allocation
    instance_names = [i.name for i in state.instances]
    assert len(instance_names) == len(set(instance_names)), Counter(instance_names).most_common(3)
    assert {i.node for i in state.instances} <= set(names)
    ips = {n.name: n.ip for n in nodes.allocation}
    assert all(i.node_ip == ips[i.node] for i in state.instances)

    # the allocation is partitioned: reserved | engine workers | each pool | spares
    pools = list(nodes.pools.values())
    groups = [set(nodes.reserved), set(nodes.workers), *map(set, pools), set(nodes.spares)]
    assert sum(len(g) for g in groups) == len(names)
    assert set().union(*groups) == set(names)
    for k, pool in enumerate(pools):
        assert len(set(pool)) == len(pool)
        assert set(pool).isdisjoint(nodes.workers)
        assert set(pool).isdisjoint(nodes.reserved)
        for other in pools[k + 1 :]:
            assert set(pool).isdisjoint(other)
    assert set(nodes.workers).isdisjoint(nodes.reserved)
    assert len(nodes.reserved) == (
        1 if recipe.frontend.dedicated_node or recipe.benchmark.client_dedicated_node else 0
    )

    # pools in services: order, of the declared sizes; extra nodes are spares only with pools
    owners = pool_services(recipe)
    assert list(nodes.pools) == [o.name for o in owners]
    assert [len(p) for p in pools] == [o.nodes for o in owners]
    role_nodes = [n for ns in nodes.role_nodes.values() for n in ns]
    assert len(role_nodes) == engine_node_count(recipe)
    assert set(role_nodes) <= set(nodes.workers)
    if owners:
        assert tuple(role_nodes) == nodes.workers
        assert len(nodes.spares) == extra
        total = engine_node_count(recipe) + sum(o.nodes or 0 for o in owners)
        summary = dict(state.node_summary)
        assert summary["total"] == total == engine_node_count(recipe) + sum(map(len, pools))
        assert summary["engine roles"] == engine_node_count(recipe)
        for o in owners:
            assert summary[f"pool {o.name} ({o.type})"] == o.nodes
    else:
        assert state.node_summary == ()
        assert nodes.spares == ()
    if extra == 0:
        assert nodes.spares == ()
    assert nodes.compute == tuple(dict.fromkeys([*nodes.workers, *(n for p in pools for n in p)]))

    # every instance sits on a node of its placement, in placement order
    for service, _ in effective_services(recipe):
        mine = [i for i in state.instances if i.service == service.name]
        want = expected_nodes(recipe, state, service.name)
        assert [i.node for i in mine] == want, service.name
        assert [i.index for i in mine] == list(range(len(want)))
        if service.nodes is not None:
            assert all(i.kind is InstanceKind.OWNER and i.pool == service.name for i in mine)
            assert len(mine) == service.nodes
        elif is_rider(service):
            assert all(i.kind is InstanceKind.RIDER for i in mine)
            assert all(i.restart.policy == "on-failure" for i in mine)
    for inst in state.instances:
        if inst.kind is InstanceKind.WORKER:
            assert inst.node in nodes.role_nodes[inst.service]
        elif inst.kind is InstanceKind.FRONTEND:
            assert inst.node == nodes.head
        elif inst.kind is InstanceKind.BENCHMARK:
            assert inst.node == nodes.bench

    # stages come in phase order and cover every instance once
    staged = [n for s in state.stages for n in s.instances]
    assert sorted(staged) == sorted(instance_names)
    order = [PHASE_ORDER.index(s.phase) for s in state.stages]
    assert order == sorted(order)

    # exporters scrape nodes their service runs on
    for exporter in state.exporters:
        assert exporter.node in {i.node for i in state.instances if i.service == exporter.service}

    env = dict(state.benchmark_env)
    assert env["SRT_WORKER_NODES"] == ",".join(dict.fromkeys(role_nodes))


@settings(max_examples=examples(100), **COMMON)
@given(recipe_dicts(), st.integers(0, 3))
def test_random_valid_recipes_plan_correctly(d: dict[str, Any], extra: int) -> None:
    recipe = load(d)
    size = allocation_size(recipe)
    for more in sorted({0, extra}):
        state = expand(recipe, local_allocation(size + more))
        check_plan(recipe, state, size, more)


@settings(max_examples=examples(25), **COMMON)
@given(recipe_dicts())
def test_one_node_short_is_refused(d: dict[str, Any]) -> None:
    recipe = load(d)
    size = allocation_size(recipe)
    if size < 2:
        return
    try:
        expand(recipe, local_allocation(size - 1))
    except ExpandError as exc:
        (problem,) = exc.problems
        # The field that asks for the node too many (issue 23), or the allocation itself.
        assert problem.path == ("allocation",) or problem.path[-1] == "nodes", problem.path
        assert "non-reserved node(s) but the recipe needs" in problem.message or (
            "require at least 2 nodes" in problem.message
        )
    else:
        raise AssertionError(f"{size - 1} nodes accepted for a recipe that needs {size}")


# --- mutations: broken recipes fail with RecipeError/ExpandError and nothing else -----------

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10),
    st.floats(-2, 2, allow_nan=False),
    st.text(max_size=8),
    st.lists(st.integers(-2, 3), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(0, 3), max_size=2),
    st.sampled_from(["head", "workers", "own0", "ride0", "svc0", "agg", "", " ", "a/b", "{x}"]),
)
NAMEISH = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["own0", "own1", "ride0", "svc0", "ghost", "", "..", "a/b", "x;rm", "-"]),
)
UNKNOWN_KEYS = st.sampled_from(["plcement", "node", "pool", "nodez", "extra", "typ", "x"])


def _slots(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) pair in a nested dict/list, for picking a mutation site."""
    if isinstance(value, dict):
        for key in list(value):
            out.append((value, key))
            _slots(value[key], out)
    elif isinstance(value, list):
        for index in range(len(value)):
            out.append((value, index))
            _slots(value[index], out)
    return out


@st.composite
def mutated_dicts(draw: st.DrawFn) -> dict[str, Any]:
    d = draw(recipe_dicts(ports=True))
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(d, [])
        container, key = slots[draw(st.integers(0, len(slots) - 1))]
        op = draw(st.sampled_from(["drop", "junk", "unknown", "negative", "nameish"]))
        if op == "drop":
            del container[key]
        elif op == "junk":
            container[key] = draw(JUNK)
        elif op == "unknown":
            target = container[key] if isinstance(container[key], dict) else container
            if isinstance(target, dict):
                target[draw(UNKNOWN_KEYS)] = draw(JUNK)
        elif op == "negative":
            container[key] = draw(st.integers(-10, 0))
        else:
            container[key] = draw(NAMEISH)
    return d


@settings(max_examples=examples(100), **COMMON)
@given(mutated_dicts())
def test_broken_recipes_fail_only_with_recipe_errors(d: dict[str, Any]) -> None:
    text = yaml.safe_dump(d, sort_keys=False)
    try:
        recipe = load_text(text)
    except RecipeError as exc:
        assert exc.problems
        assert all(p.line >= 1 for p in exc.problems), exc.lines()
        assert all(line.startswith("recipe.yaml:") for line in exc.lines())
        return
    size = allocation_size(recipe)
    assert size <= 100  # mutations only draw small numbers
    try:
        state = expand(recipe, local_allocation(size))
    except ExpandError as exc:
        assert exc.problems
        return
    names = [i.name for i in state.instances]
    assert len(names) == len(set(names))
