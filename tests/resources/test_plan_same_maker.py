"""The instances of a service whose fields do not depend on the node's placeholder values
are made by `ServiceCommon.same` (its slots filled directly, no values worked out per node):
they must be exactly what the general path (`ServiceCommon.instance`) makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from srtr.resources import instances
from srtr.resources.planning import plan_text_source

ROOT = Path(__file__).resolve().parents[2]
RECIPES = [*sorted((ROOT / "examples").glob("*.yaml")), *sorted(ROOT.glob("examples/seeds/*.yaml"))]

# A pool with riders of every shape: fixed (the maker), per-node argv, env and preamble
# (the general path), probes and liveness, leaders, a file probe that names the node.
MIXED = """\
name: mixed
services:
  - name: base
    command: ["sleep", "infinity"]
    nodes: 5
    env: {A: "1"}
    preamble: "ulimit -n 4096"
    readiness: {tcp: {port: 7001}}
    liveness: {http: {port: 7001, path: /live}}
  - name: fixed
    command: ["sleep", "infinity"]
    placement: {pool: base}
    env: {B: "{job_name}", C: "{pool_ip:base}", D: "{pool_node_count}"}
  - name: argv
    command: ["echo", "{node}"]
    placement: {pool: base}
  - name: env
    command: ["sleep", "infinity"]
    placement: {pool: base}
    env: {WHERE: "{node_ip}:{index}"}
  - name: preamble
    command: ["sleep", "infinity"]
    placement: {pool: base}
    preamble: "cd /tmp/{node}"
  - name: filed
    command: ["sleep", "infinity"]
    placement: {pool: base}
    readiness: {file: {path: "/tmp/{node}.ready"}}
  - name: execd
    command: ["sleep", "infinity"]
    placement: {pool: base}
    liveness: {exec: {command: ["test", "-e", "/tmp/{node}"]}}
"""


def _both(text: str, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object, int]:
    made = 0
    real = instances._same

    def counted(shared: instances.ServiceCommon, keys: frozenset[str]) -> instances.Maker | None:
        nonlocal made
        maker = real(shared, keys)
        made += maker is not None
        return maker

    with monkeypatch.context() as patch:
        patch.setattr(instances, "_same", counted)
        _, fast = plan_text_source(text, name)
    with monkeypatch.context() as patch:
        patch.setattr(instances, "_same", lambda shared, keys: None)
        _, general = plan_text_source(text, name)
    return fast, general, made


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_examples_plan_the_same_either_way(recipe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, general, _ = _both(recipe.read_text(), str(recipe), monkeypatch)
    assert fast == general


def test_per_node_fields_take_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, general, made = _both(MIXED, "mixed.yaml", monkeypatch)
    assert fast == general
    assert made == 2  # base, and fixed: what it names is the same on every node
    by_name = {spec.name: spec for spec in fast.instances}  # type: ignore[attr-defined]
    assert by_name["service_argv_node2"].argv == ("echo", "node2")
    assert {("B", "mixed"), ("C", "127.0.0.2"), ("D", "5")} <= set(
        by_name["service_fixed_node3"].env
    )
    assert by_name["service_base_node1"].argv is by_name["service_base_node4"].argv
