"""`depends_on`: its two forms, the plan-time refusals (each `FILE:LINE: path: message`),
the start graph in `srtr plan`, and recipes without it planning as before."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from srtr.cli import main
from srtr.controllers.dependency_decisions import start_step
from srtr.resources.errors import RecipeError
from srtr.resources.planning import plan_text_source
from srtr.store.status import InstanceStatus, Phase


def recipe(*services: str) -> str:
    head = "name: deps\nresources: {gpus_per_node: 0}\nservices:\n"
    return head + "".join(textwrap.indent(textwrap.dedent(s), "  ") for s in services)


A = """\
- name: a
  nodes: 1
  command: [sleep, "1000"]
  depends_on: [b]
"""
B = """\
- name: b
  nodes: 1
  command: [sleep, "1000"]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        plan_text_source(text, "r.yaml")
    return info.value.lines()


def test_the_list_form_is_condition_ready_without_restart() -> None:
    _, state = plan_text_source(recipe(A, B), "r.yaml")
    (edge,) = state.dependencies
    assert (edge.service, edge.on, edge.condition, edge.restart) == ("a", "b", "ready", False)
    assert edge.instances == ("service_b",) and edge.dependents == ("service_a",)


def test_the_mapping_form_and_an_empty_entry() -> None:
    text = recipe(
        A.replace("depends_on: [b]", "depends_on: {b: {condition: started, restart: true}, c:}"),
        B,
        B.replace("name: b", "name: c"),
    )
    _, state = plan_text_source(text, "r.yaml")
    got = [(e.on, e.condition, e.restart) for e in state.dependencies]
    assert got == [("b", "started", True), ("c", "ready", False)]


def test_an_unknown_name_is_refused_with_the_services() -> None:
    lines = problems(recipe(A.replace("[b]", "[bee]"), B))
    assert lines == [
        "r.yaml:7: services[0].depends_on.bee: 'bee' is not a service of this recipe (services: b)"
    ]


def test_a_cycle_is_refused_naming_its_services() -> None:
    text = recipe(A, B + "  depends_on: {a: {condition: started}}\n")
    assert problems(text) == [
        "r.yaml:7: services[0].depends_on: forms a cycle: a -> b -> a; none of them could "
        "ever start"
    ]


def test_a_service_cannot_depend_on_itself() -> None:
    (line,) = problems(recipe(A.replace("[b]", "[a]"), B))
    assert line.endswith("services[0].depends_on.a: services[a] cannot depend on itself")


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ("  restart: always\n", "services[b] has restart: always"),
        ("", None),  # restart: never, a pool of its own: it can end
    ],
)
def test_completed_must_be_able_to_hold(extra: str, why: str | None) -> None:
    text = recipe(A.replace("[b]", "{b: {condition: completed}}"), B + extra)
    if why is None:
        _, state = plan_text_source(text, "r.yaml")
        assert state.instance("service_b").run_to_completion
        assert not state.instance("service_a").run_to_completion
        return
    (line,) = problems(text)
    assert line.startswith("r.yaml:7: services[0].depends_on.b: condition completed can never")
    assert why in line


def test_completed_on_a_rider_of_a_pool_that_never_ends_is_refused() -> None:
    rider = "- name: r\n  placement: {pool: b}\n  command: [sleep, '1']\n"
    (line,) = problems(recipe(A.replace("[b]", "{r: {condition: completed}}"), B, rider))
    assert "services[r] rides pool b, which never ends (not terminal)" in line
    terminal = B + "  terminal: true\n"
    plan_text_source(recipe(A.replace("[b]", "{r: {condition: completed}}"), terminal, rider), "")


def test_a_dependency_of_a_later_phase_is_refused() -> None:
    (line,) = problems(recipe(A + "  start: before_workers\n", B))
    assert "services[a] starts in phase before_workers, before services[b]" in line


def test_with_workers_cannot_wait() -> None:
    lines = problems(recipe(A + "  start: with_workers\n", B + "  start: before_workers\n"))
    assert any("start: with_workers launches with the engine workers" in x for x in lines)


def test_a_recipe_without_depends_on_has_no_graph() -> None:
    _, state = plan_text_source(recipe(B), "r.yaml")
    assert state.dependencies == ()


def test_a_later_phase_waits_for_the_dependents_of_earlier_ones() -> None:
    # a (before_workers) waits for b; c (after_frontend, no depends_on) waits for a too
    c = B.replace("name: b", "name: c")
    _, state = plan_text_source(
        recipe(A + "  start: before_workers\n", B + "  start: before_workers\n", c), "r.yaml"
    )
    specs = {s.name: s for s in state.instances}
    statuses = {s.name: InstanceStatus() for s in state.instances}
    b = statuses["service_b"]
    b.activated, b.attempt, b.phase, b.ready_attempt = True, 0, Phase.RUNNING, 0
    step = start_step(state.stages, state.dependencies, specs, statuses, {"before_workers/b"})
    assert step.activate == ("service_a",)  # b is up: a begins
    assert step.chain.activate == ()  # c waits for a, a stage of an earlier phase
    step = start_step(
        state.stages,
        state.dependencies,
        specs,
        statuses,
        {"before_workers/b", "before_workers/a"},
    )
    assert step.chain.activate == ("service_c",)


def test_srtr_plan_prints_the_start_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(recipe(A.replace("[b]", "{b: {restart: true}}"), B))
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Start graph (depends_on; the other stages start in launch order):\n" in text
    assert "  a waits for b ready (restarts with it)\n" in text
    assert main(["plan", str(path), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["start_graph"] == [
        {"service": "a", "waits_for": [{"service": "b", "condition": "ready", "restart": True}]}
    ]
