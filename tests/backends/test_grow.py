"""Pools that outgrow the allocation (issue 24): the pure planning (grow decision, limits,
shrink preference), the local simulated provisioner, provisioned nodes on the local backend,
and a `max_nodes` refusal of a live edit end to end."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from srtr.backends.base import LaunchSpec, NodeInfo, Observation
from srtr.backends.local.backend import LocalBackend
from srtr.backends.provision import (
    DELAY_ENV,
    LocalProvisioner,
    ProvisionError,
    RequestPhase,
    RequestState,
    delay_from_env,
    pending_reason,
)
from srtr.controllers import grow
from srtr.resources.carving import CarveError, GrowNeeded, releasable
from srtr.resources.errors import GrowRequired, RecipeError
from srtr.resources.expand import ExpandError, expand, local_allocation
from srtr.resources.loading import load_text
from srtr.resources.objects import DesiredState
from tests.support.controller_harness import Harness
from tests.support.e2e_util import Run, events, wait_for

GROW = """
name: g
resources: {{{resources}}}
services:
  - name: train
    command: [sleep, inf]
    nodes: {n}
  - name: watcher
    command: [sleep, inf]
    placement: {{pool: train}}
"""


def state(
    n: int,
    nodes: int,
    previous: DesiredState | None = None,
    resources: str = "",
    provisioned: frozenset[str] = frozenset(),
) -> DesiredState:
    recipe = load_text(textwrap.dedent(GROW.format(n=n, resources=resources)))
    allocation = local_allocation(nodes)
    return expand(recipe, allocation, previous.nodes if previous else None, provisioned)


# --- the grow decision ------------------------------------------------------------------------


def test_growing_past_the_spares_asks_for_the_missing_nodes_by_default() -> None:
    old = state(2, nodes=3)
    with pytest.raises(ExpandError) as info:
        state(5, nodes=3, previous=old)
    problem = info.value.problems[0]
    assert "pool train would grow past the allocation: it needs 3 more node(s) and 1" in (
        problem.message
    )
    # expand reports any carve error alike; the carve itself says it is a grow request
    from srtr.resources.carving import recarve

    recipe = load_text(textwrap.dedent(GROW.format(n=5, resources="")))
    with pytest.raises(GrowNeeded) as grow:
        recarve(recipe, local_allocation(3), old.nodes)
    assert grow.value.missing == {"train": 2}
    assert grow.value.total == 2
    assert grow.value.path == ("services", 0, "nodes")


def test_grow_never_keeps_the_refusal() -> None:
    from srtr.resources.carving import recarve

    old = state(2, nodes=3, resources="grow: never")
    recipe = load_text(textwrap.dedent(GROW.format(n=5, resources="grow: never")))
    with pytest.raises(CarveError) as info:
        recarve(recipe, local_allocation(3), old.nodes)
    assert not isinstance(info.value, GrowNeeded)
    assert str(info.value) == (
        "pool train would grow past the allocation: it needs 3 more node(s) and 1 are spare"
    )


def test_growing_past_max_nodes_is_refused_with_the_cap() -> None:
    from dataclasses import replace

    from srtr.resources.carving import recarve

    # A recipe asking for more than max_nodes is refused by the rule (below); the carve's
    # cap counts what the recipe does not: here a lost node that still holds its place.
    old = state(2, nodes=3, resources="max_nodes: 3")
    lost = replace(old.nodes, lost=("node3",), spares=())
    recipe = load_text(textwrap.dedent(GROW.format(n=3, resources="max_nodes: 3")))
    with pytest.raises(CarveError) as info:
        recarve(recipe, local_allocation(3), lost)
    assert not isinstance(info.value, GrowNeeded)
    assert str(info.value) == (
        "pool train would grow past the allocation: it needs 1 more node(s) and 0 are spare; "
        "growing needs 1 more node(s) but the run has 3 of resources.max_nodes 3"
    )
    # within the cap it is a grow request again
    recipe = load_text(textwrap.dedent(GROW.format(n=3, resources="max_nodes: 4")))
    with pytest.raises(GrowNeeded) as grow:
        recarve(recipe, local_allocation(3), lost)
    assert grow.value.missing == {"train": 1}


def test_growth_onto_spares_needs_no_request() -> None:
    old = state(2, nodes=4, resources="grow: never")
    new = state(4, nodes=4, previous=old, resources="grow: never")
    assert new.nodes.pools["train"] == ("node1", "node2", "node3", "node4")


# --- limits at plan time ----------------------------------------------------------------------


def test_max_nodes_below_the_start_is_a_plan_error() -> None:
    with pytest.raises(RecipeError) as info:
        load_text(textwrap.dedent(GROW.format(n=3, resources="max_nodes: 2")))
    [problem] = info.value.problems
    assert problem.path == ("resources", "max_nodes")
    assert problem.message == (
        "is 2 but the recipe needs 3 node(s); raise max_nodes or shrink the pools"
    )


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ("grow: sometimes", "grow"),
        ("max_nodes: 0", "max_nodes"),
        ("max_nodes: yes", "max_nodes"),
    ],
)
def test_bad_growth_fields_are_refused(resources: str, message: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_text(textwrap.dedent(GROW.format(n=2, resources=resources)))
    assert any(message in ".".join(map(str, p.path)) for p in info.value.problems)


def test_srtr_plan_reports_max_nodes_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(GROW.format(n=3, resources="max_nodes: 2")))
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "plan", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"{path}:3: resources.max_nodes: is 2 but the recipe needs 3 node(s)" in done.stderr
    assert "Traceback" not in done.stderr


# --- shrink preference ------------------------------------------------------------------------


def test_shrink_frees_provisioned_nodes_first() -> None:
    # node1..node2 are the main allocation, node3..node4 came from a grow request and sit
    # first in the pool's order on purpose: the shrink must still keep the main ones.
    provisioned = frozenset({"node3", "node4"})
    old = state(4, nodes=4, provisioned=provisioned)
    assert old.nodes.pools["train"] == ("node1", "node2", "node3", "node4")
    new = state(2, nodes=4, previous=old, provisioned=provisioned)
    assert new.nodes.pools["train"] == ("node1", "node2")
    assert releasable(new.nodes, provisioned) == ("node3", "node4")

    # a pool whose main nodes are fewer than what it keeps holds on to provisioned ones
    new = state(3, nodes=4, previous=old, provisioned=provisioned)
    assert new.nodes.pools["train"] == ("node1", "node2", "node3")
    assert releasable(new.nodes, provisioned) == ("node4",)


def test_shrink_without_provisioned_nodes_keeps_the_first_and_releases_none() -> None:
    old = state(4, nodes=4)
    new = state(2, nodes=4, previous=old)
    assert new.nodes.pools["train"] == ("node1", "node2")
    assert releasable(new.nodes, frozenset()) == ()
    assert new.nodes.spares == ("node3", "node4")


# --- the local simulated provisioner ----------------------------------------------------------


async def _until(provisioner: LocalProvisioner, rid: str, phase: RequestPhase) -> RequestState:
    async def poll() -> RequestState:
        while True:
            current = await provisioner.state(rid)
            if current.phase is phase:
                return current
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(poll(), 10)


def test_local_provisioner_grants_new_loopback_nodes_after_the_delay() -> None:
    async def scenario() -> None:
        provisioner = LocalProvisioner(3, delay=0.3)
        rid = await provisioner.request("g", 2)
        first = await provisioner.state(rid)
        assert first.phase is RequestPhase.PENDING and not first.nodes
        assert pending_reason("local", first).startswith(
            f"waiting for 2 node(s) from local (request {rid}: Resources"
        )
        granted = await _until(provisioner, rid, RequestPhase.GRANTED)
        assert granted.nodes == (NodeInfo("node3", "127.0.0.4"), NodeInfo("node4", "127.0.0.5"))
        # names are never reused: the next request numbers after these
        other = await provisioner.request("g", 1)
        assert (await _until(provisioner, other, RequestPhase.GRANTED)).nodes[0].name == "node5"
        # release one node, then the other: the request ends with its last node
        partly = await provisioner.release(rid, ["node4"])
        assert partly.phase is RequestPhase.GRANTED and [n.name for n in partly.nodes] == ["node3"]
        done = await provisioner.release(rid, ["node3"])
        assert done.phase is RequestPhase.RELEASED and not done.live
        # state.json round trip
        assert RequestState.from_json(partly.to_json()) == partly
        await provisioner.close()
        assert not any(r.live for r in provisioner.requests())

    asyncio.run(scenario())


def test_local_provisioner_cancel_while_pending_never_grants() -> None:
    async def scenario() -> None:
        provisioner = LocalProvisioner(3, delay=30)
        rid = await provisioner.request("g", 2)
        cancelled = await provisioner.cancel(rid)
        assert cancelled.phase is RequestPhase.CANCELLED and not cancelled.nodes
        assert (await provisioner.cancel(rid)).phase is RequestPhase.CANCELLED  # idempotent

    asyncio.run(scenario())


def test_local_provisioner_refusal_and_delay_configuration() -> None:
    async def scenario() -> None:
        provisioner = LocalProvisioner(3, refuse="QOSMaxNodePerUserLimit")
        with pytest.raises(ProvisionError, match="QOSMaxNodePerUserLimit"):
            await provisioner.request("g", 2)
        assert provisioner.requests() == []

    asyncio.run(scenario())
    assert delay_from_env({}) == 2.0
    assert delay_from_env({DELAY_ENV: "0.5"}) == 0.5
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match=DELAY_ENV):
            delay_from_env({DELAY_ENV: bad})


# --- provisioned nodes on the local backend (real processes) ---------------------------------


def test_local_backend_runs_on_added_nodes_and_releases_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = LocalBackend(2)
        exits: list[Observation] = []
        exited = asyncio.Event()

        def listen(observation: Observation) -> None:
            exits.append(observation)
            exited.set()

        backend.set_listener(listen)
        backend.isolate_nodes(tmp_path / "nodes")
        await backend.add_nodes([NodeInfo("node3", "127.0.0.4")])
        assert [n.name for n in backend.nodes()] == ["node1", "node2", "node3"]
        with pytest.raises(ValueError, match="already in the allocation"):
            await backend.add_nodes([NodeInfo("node2", "127.0.0.3")])
        log = tmp_path / "x.log"
        spec = LaunchSpec(
            name="x",
            node="node3",
            node_ip="127.0.0.4",
            argv=("sleep", "1000"),
            env={"PATH": "/usr/bin:/bin"},
            log_path=log,
        )
        await backend.launch(spec)
        assert backend.running() == {"x"}
        with pytest.raises(ValueError, match="still runs x"):
            await backend.remove_nodes(["node3"])
        with pytest.raises(ValueError, match="did not come from a grow request"):
            await backend.remove_nodes(["node1"])
        await backend.signal("x", 9)

        await asyncio.wait_for(exited.wait(), 10)
        assert [o.name for o in exits] == ["x"] and not backend.running()
        await backend.remove_nodes(["node3"])
        assert [n.name for n in backend.nodes()] == ["node1", "node2"]
        await backend.close()

    asyncio.run(scenario())


# --- a live edit past max_nodes, end to end ---------------------------------------------------

LIVE = """
name: grow
resources: {{max_nodes: 3}}
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: {n}
  - name: watcher
    command: ["sleep", "1000"]
    placement: {{pool: train}}
"""


@pytest.mark.e2e
def test_live_edit_past_max_nodes_is_rejected_and_touches_nothing(tmp_path: Path) -> None:
    import signal

    run = Run(tmp_path, LIVE.format(n=2))
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="running")
        before = {i["name"]: i["pid"] for i in state["instances"]}
        tmp = run.recipe.with_suffix(".tmp")
        tmp.write_text(textwrap.dedent(LIVE.format(n=4)))
        tmp.replace(run.recipe)
        wait_for(
            lambda: any(e["reason"] == "RecipeRejected" for e in events(run.run_dir)),
            20,
            "grow past max_nodes rejected",
        )
        [rejected] = [e for e in events(run.run_dir) if e["reason"] == "RecipeRejected"]
        assert "resources.max_nodes: is 3 but the recipe needs 4 node(s)" in rejected["message"]
        assert f"{run.recipe}:3:" in rejected["message"]
        state = run.wait_state(lambda s: s["recipe"].get("rejected"), what="rejection saved")
        assert {i["name"]: i["pid"] for i in state["instances"]} == before
        assert state["job"]["generation"] == 1
    finally:
        run.signal(signal.SIGINT)
        run.finish(gone_within=10)


# --- the grow key ------------------------------------------------------------------------------


class _PokedProvisioner:
    """A provider whose request stays pending; counts how often the grower looks at it."""

    provider = "fake"

    def __init__(self) -> None:
        self.looks = 0
        self.on_poke: Callable[[], None] = lambda: None
        self._requests: list[RequestState] = []

    async def request(self, run: str, count: int) -> str:
        self._requests = [RequestState("r1", count, RequestPhase.PENDING, "submitted")]
        return "r1"

    async def state(self, request_id: str) -> RequestState:
        self.looks += 1
        self._requests = [RequestState(request_id, 2, RequestPhase.PENDING, "Resources")]
        return self._requests[0]

    async def release(self, request_id: str, nodes: Sequence[str]) -> RequestState:
        raise AssertionError("nothing to release")

    async def cancel(self, request_id: str) -> RequestState:
        return RequestState(request_id, 2, RequestPhase.CANCELLED)

    def requests(self) -> list[RequestState]:
        return list(self._requests)

    async def close(self) -> None:
        pass


POKED = """
name: g
services:
  - name: train
    command: [sleep, inf]
"""


def test_a_providers_poke_wakes_the_grower_before_its_period(tmp_path: Path) -> None:
    provisioner = _PokedProvisioner()

    async def main() -> None:
        h = Harness(POKED, tmp_path)
        await h.settle()
        grow.setup(h.ctx, provisioner)
        await grow.want(h.ctx, GrowRequired("g.yaml", [], {"train": 2}))
        await h.settle()  # the key's first look, then it waits a PERIOD (the clock stands)
        assert provisioner.looks >= 1
        looks = provisioner.looks
        await h.settle()
        assert provisioner.looks == looks  # no period passed, nothing looked again
        provisioner.on_poke()  # an agent of the request dialled in
        await h.settle()
        assert provisioner.looks == looks + 1
        assert h.store.pools["train"].pending is not None  # the provider's word, per pool
        await h.advance(grow.PERIOD)
        assert provisioner.looks == looks + 2  # and it keeps looking while pending

    asyncio.run(main())
