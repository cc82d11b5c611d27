"""Pure tests of live-edit planning: sticky carving and diff(desired, new)."""

from __future__ import annotations

import textwrap

import pytest

from srtr.resources.diff import diff, render
from srtr.resources.expand import ExpandError, expand, local_allocation
from srtr.resources.loading import load_text
from srtr.resources.objects import DesiredState

BASE = """
name: t
services:
  - name: train
    command: [sleep, inf]
    nodes: 4
  - name: watcher
    command: [sleep, inf]
    placement: {pool: train}
    env: {LEVEL: "1"}
"""


def state(text: str, nodes: int = 4, previous: DesiredState | None = None) -> DesiredState:
    recipe = load_text(textwrap.dedent(text))
    return expand(recipe, local_allocation(nodes), previous.nodes if previous else None)


def test_adding_a_rider_adds_one_instance_per_pool_node_and_restarts_nothing() -> None:
    old = state(BASE)
    new = state(
        BASE
        + """
  - name: shipper
    command: [ship]
    placement: {pool: train}
""",
        previous=old,
    )
    plan = diff(old, new)
    assert [c.name for c in plan.add] == [f"service_shipper_node{k}" for k in range(1, 5)]
    assert not plan.restart and not plan.remove and not plan.refused
    assert plan.applicable


def test_changing_a_riders_env_restarts_only_that_rider() -> None:
    old = state(BASE)
    new = state(BASE.replace('LEVEL: "1"', 'LEVEL: "2"'), previous=old)
    plan = diff(old, new)
    assert [c.name for c in plan.restart] == [f"service_watcher_node{k}" for k in range(1, 5)]
    assert all(c.detail == "env" for c in plan.restart)
    assert not plan.add and not plan.remove


def test_removing_a_rider_removes_its_instances() -> None:
    old = state(BASE)
    new = state(BASE.split("  - name: watcher")[0], previous=old)
    plan = diff(old, new)
    assert [c.name for c in plan.remove] == [f"service_watcher_node{k}" for k in range(1, 5)]
    assert not plan.restart


def test_probe_timing_and_restart_policy_are_hot_changes() -> None:
    old = state(BASE)
    edited = BASE + "    readiness: {port: 80, timeout_seconds: 5}\n"
    probed = state(edited, previous=old)
    assert len(diff(old, probed).restart) == 4  # a new probe target restarts
    faster = state(
        edited.replace("timeout_seconds: 5", "timeout_seconds: 9") + "    restart: always\n",
        previous=probed,
    )
    plan = diff(probed, faster)
    assert not plan.restart and len(plan.hot) == 4
    assert "probe" in plan.hot[0].detail and "restart" in plan.hot[0].detail


GROW = """
name: g
services:
  - name: train
    command: [sleep, inf]
    nodes: {n}
  - name: napper
    command: [sleep, inf]
    nodes: 1
  - name: watcher
    command: [sleep, inf]
    placement: {{pool: train}}
"""


def test_growing_a_pool_takes_a_spare_and_moves_nothing() -> None:
    old = state(GROW.format(n=2), nodes=4)
    assert old.nodes.pools == {"train": ("node1", "node2"), "napper": ("node3",)}
    assert old.nodes.spares == ("node4",)
    new = state(GROW.format(n=3), nodes=4, previous=old)
    assert new.nodes.pools == {"train": ("node1", "node2", "node4"), "napper": ("node3",)}
    assert new.nodes.spares == ()
    plan = diff(old, new)
    assert [c.name for c in plan.add] == ["service_train_node4", "service_watcher_node4"]
    assert not plan.remove and not plan.refused
    # the existing owners see a bigger pool in their placeholders only if they use them:
    assert not plan.restart


def test_shrinking_a_pool_frees_its_last_nodes() -> None:
    old = state(GROW.format(n=2), nodes=4)
    new = state(GROW.format(n=1), nodes=4, previous=old)
    assert new.nodes.pools["train"] == ("node1",)
    assert set(new.nodes.spares) == {"node2", "node4"}
    plan = diff(old, new)
    # a one-node pool names its instance without the node suffix
    assert {c.name for c in plan.remove} == {
        "service_train_node1",
        "service_train_node2",
        "service_watcher_node1",
        "service_watcher_node2",
    }
    assert {c.name for c in plan.add} == {"service_train", "service_watcher"}


def test_growing_past_the_allocation_is_refused() -> None:
    old = state(GROW.format(n=2), nodes=4)
    with pytest.raises(
        ExpandError, match="pool train would grow past the allocation: it needs 2 more node"
    ):
        state(GROW.format(n=4), nodes=4, previous=old)


ROLE = """
name: r
roles:
  agg: {{nodes: {n}, command: [serve]}}
services:
  - name: train
    command: [sleep, inf]
    nodes: 1
    terminal: {terminal}
"""


def test_role_size_and_terminal_flips_are_refused() -> None:
    old = state(ROLE.format(n=1, terminal="false"), nodes=3)
    with pytest.raises(ExpandError, match="engine roles cannot change size"):
        state(ROLE.format(n=2, terminal="false"), nodes=3, previous=old)
    flipped = state(ROLE.format(n=1, terminal="true"), nodes=3, previous=old)
    plan = diff(old, flipped)
    assert plan.refused == ("terminal flag of train cannot flip while the job runs",)
    assert not plan.applicable
    assert "! terminal flag" in render(plan)


def test_a_started_benchmark_cannot_change() -> None:
    text = BASE + "benchmark: {type: custom, command: 'echo 1'}\n"
    old = state(text)
    new = state(text.replace("echo 1", "echo 2"), previous=old)
    assert diff(old, new).refused == ()
    assert diff(old, new, launched=frozenset({"benchmark"})).refused == (
        "the benchmark step already started; change it in a new run",
    )


def test_no_change_is_an_empty_plan() -> None:
    old = state(BASE)
    plan = diff(old, state(BASE + "# a comment\n", previous=old))
    assert plan.empty and render(plan) == "No changes.\n"
