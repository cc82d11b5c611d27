"""A service's per-node `setup` at plan level: one SETUP step per node, rendered for its node,
in a stage of its own before the service's, and what a live edit may do with it. The
controllers' side: tests/controllers/test_node_setup.py; real processes:
tests/e2e/local/test_node_setup.py and tests/e2e/slurm/test_node_setup.py."""

from __future__ import annotations

import textwrap

import pytest

from srtr.resources.diff import diff
from srtr.resources.expand import local_allocation
from srtr.resources.objects import DesiredState, InstanceKind
from srtr.resources.planning import plan_text_source
from srtr.resources.render import plan_json, plan_text
from tests.resources.test_validation import check, problem

POOL = """\
name: t
services:
  - name: sched
    command: [sched]
    nodes: 1
  - name: pool
    nodes: {nodes}
    command: [work, "{{node}}"]
    env: {{SHARD: "s-{{index}}", SCHED: "{{pool_ip:sched}}"}}
    setup: |
      echo "$SHARD" > /tmp/marker
      echo {{node}} {{index}} {{pool_nodes}} {{pool_ip:pool}} >> /tmp/marker
    setup_timeout_seconds: 42
"""


def plan(text: str, nodes: int, previous: DesiredState | None = None) -> DesiredState:
    allocation = local_allocation(nodes)
    before = previous.nodes if previous is not None else None
    return plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation, before)[1]


def test_each_node_of_the_service_gets_one_setup_step_rendered_for_it() -> None:
    state = plan(POOL.format(nodes=3), 4)
    steps = [s for s in state.instances if s.kind is InstanceKind.SETUP]
    assert [(s.name, s.node, s.index, s.log) for s in steps] == [
        ("setup_pool_node2", "node2", 0, "logs/setup_pool_node2.out"),
        ("setup_pool_node3", "node3", 1, "logs/setup_pool_node3.out"),
        ("setup_pool_node4", "node4", 2, "logs/setup_pool_node4.out"),
    ]
    step = state.instance("setup_pool_node3")
    assert step.shell and step.argv == (
        'echo "$SHARD" > /tmp/marker\necho node3 1 node2,node3,node4 127.0.0.3 >> /tmp/marker\n',
    )
    # the environment its node's instance has, placeholders rendered
    assert step.env == state.instance("service_pool_node3").env
    assert ("SHARD", "s-1") in step.env and ("SCHED", "127.0.0.2") in step.env
    assert (step.run_timeout_seconds, step.critical, step.restart.policy) == (42.0, False, "never")
    assert (step.probe, step.liveness, step.pool, step.preamble) == (None, None, None, None)


def test_the_setup_stage_comes_right_before_the_service_s_own() -> None:
    state = plan(POOL.format(nodes=3), 4)
    names = [(s.name, s.instances) for s in state.stages]
    assert names[-2:] == [
        ("after_frontend/pool.setup", ("setup_pool_node2", "setup_pool_node3", "setup_pool_node4")),
        (
            "after_frontend/pool",
            ("service_pool_node2", "service_pool_node3", "service_pool_node4"),
        ),
    ]


def test_a_leader_s_stage_and_a_build_are_ordered_around_the_setup() -> None:
    text = """\
    name: t
    services:
      - name: tool
        command: [tool]
        build_command: [make]
        setup: "touch /tmp/x"
      - name: pool
        nodes: 2
        command: [work]
        leader: {command: [lead]}
        setup: "touch /tmp/y"
    """
    stages = [s.name for s in plan(text, 3).stages]
    assert stages == [
        "after_frontend/tool.build",
        "after_frontend/tool.setup",
        "after_frontend/tool",
        "after_frontend/pool.setup",
        "after_frontend/pool.leader",
        "after_frontend/pool",
    ]


def test_a_service_with_source_runs_its_setup_in_the_checkout() -> None:
    text = """\
    name: t
    services:
      - name: tool
        command: [tool]
        source: {git: "file:///r", rev: v1, path: app}
        build_command: [make]
        setup: "./prepare.sh"
    """
    step = plan(text, 1).instance("setup_tool_node1")
    assert step.preamble == 'cd "$SRTR_RUN_DIR"/services/tool/src/app'


def test_a_per_worker_service_runs_its_setup_once_per_node() -> None:
    text = """\
    name: t
    resources: {gpus_per_node: 2}
    roles:
      agg: {nodes: 2, workers: 4, gpus: 1, command: [w]}
    services:
      - name: sidecar
        command: [s]
        placement: {node: workers, per: worker}
        setup: "echo {node}"
    """
    state = plan(text, 2)
    steps = [s for s in state.instances if s.kind is InstanceKind.SETUP]
    per_worker = [s for s in state.instances if s.service == "sidecar" and s not in steps]
    assert len(per_worker) == 4
    assert [(s.name, s.argv) for s in steps] == [
        ("setup_sidecar_node1", ("echo node1",)),
        ("setup_sidecar_node2", ("echo node2",)),
    ]


def test_plan_shows_the_setup_per_node_and_its_stage() -> None:
    text = textwrap.dedent(POOL.format(nodes=2))
    recipe, state = plan_text_source(text, "recipe.yaml", local_allocation(3))
    out = plan_text(recipe, state)
    assert (
        "    setup: on each node before its first instance there (timeout 42s; "
        "logs/setup_pool_<node>.out)"
    ) in out
    row = next(line for line in out.splitlines() if line.startswith("  setup_pool_node3 "))
    assert row.split()[1:5] == ["pool", "setup", "node3", "127.0.0.4"]
    assert row.endswith(
        'echo "$SHARD" > /tmp/marker; echo node3 1 node2,node3 127.0.0.3 >> /tmp/marker'
    )
    assert "  2. after_frontend/pool.setup (2 instance(s))" in out
    doc = plan_json(recipe, state)
    record = next(r for r in doc["instances"] if r["name"] == "setup_pool_node2")
    assert (record["kind"], record["stage"], record["log"]) == (
        "setup",
        "after_frontend/pool.setup",
        "logs/setup_pool_node2.out",
    )


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        (
            'setup: "  "',
            (
                5,
                "services[0].setup",
                "if set, must be non-empty shell text (omit it entirely instead)",
            ),
        ),
        ("setup_timeout_seconds: 0", (5, "services[0].setup_timeout_seconds", None)),
        ("setup: [echo]", (5, "services[0].setup", None)),
    ],
)
def test_bad_setup_fields_are_refused_with_their_line(
    field: str, expected: tuple[int, str, str | None]
) -> None:
    text = f"name: t\nservices:\n  - name: a\n    command: [a]\n    {field}\n"
    line, path, message = problem(text)
    assert (line, path) == expected[:2]
    if expected[2] is not None:
        assert message == expected[2]
    else:
        assert message


def test_a_placeholder_typo_in_setup_warns() -> None:
    text = "name: t\nservices:\n  - name: a\n    command: [a]\n    setup: echo {nodee}\n"
    state = plan(text, 1)
    assert any(
        "services[0].setup: {nodee} is not a placeholder (did you mean {node}?)" in w
        for w in state.line_warnings
    ), state.line_warnings


def test_another_pool_s_address_in_setup_must_name_a_pool() -> None:
    text = "name: t\nservices:\n  - name: a\n    nodes: 1\n    command: [a]\n"
    text += "    setup: echo {pool_ip:nope}\n"
    check(
        text,
        (
            6,
            "services[0].setup",
            "{pool_ip:nope} names no pool: 'nope' is not a service that declares nodes (pools: a)",
        ),
        nodes=1,
    )


def test_setup_without_anything_else_plans_as_before() -> None:
    check("name: t\nservices:\n  - name: a\n    command: [a]\n", None)


# --- live edits ---------------------------------------------------------------------------------


def test_a_pool_that_grows_adds_the_new_node_s_setup_and_changes_none_of_the_others() -> None:
    old = plan(POOL.format(nodes=2), 4)
    new = plan(POOL.format(nodes=3), 4, old)
    change = diff(old, new)
    assert not change.refused
    assert [c.name for c in change.add] == ["setup_pool_node4", "service_pool_node4"]
    # {pool_nodes} changed the text of the other nodes' setups: they ran; never again
    assert {c.name for c in change.hot} >= {"setup_pool_node2", "setup_pool_node3"}
    assert not [c for c in change.restart if c.name.startswith("setup_")]
    stage = next(s for s in new.stages if s.name == "after_frontend/pool.setup")
    assert stage.instances == ("setup_pool_node2", "setup_pool_node3", "setup_pool_node4")


def test_setup_cannot_be_added_to_a_running_service_but_can_be_taken_away() -> None:
    with_setup = plan(POOL.format(nodes=2), 3)
    without = plan(
        POOL.format(nodes=2).split("    setup: |")[0], 3, with_setup
    )  # the same service, no setup
    assert diff(without, with_setup).refused == (
        "services[pool].setup cannot be added while the service runs; add it in a new run",
    )
    taken = diff(with_setup, without)
    assert not taken.refused
    assert [c.name for c in taken.remove] == ["setup_pool_node2", "setup_pool_node3"]


def test_a_new_service_may_bring_its_setup_along() -> None:
    base = "name: t\nservices:\n  - name: a\n    command: [a]\n"
    added = base + "  - name: b\n    command: [b]\n    setup: echo hi\n"
    old = plan(base, 1)
    change = diff(old, plan(added, 1, old))
    assert not change.refused
    assert [c.name for c in change.add] == ["setup_b_node1", "service_b"]
