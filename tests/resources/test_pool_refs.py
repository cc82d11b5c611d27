"""Another pool's addresses: `{pool_ip:NAME}` and its kin render the named pool's instance 0
and members wherever placeholders are rendered; a NAME that owns no pool is refused with
`file:line: path: message` and the list of pools."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from srtr.cli import main
from srtr.resources.errors import RecipeError
from srtr.resources.placeholder_lint import typos
from srtr.resources.placeholders import render, template
from srtr.resources.planning import plan_text_source

RECIPE = textwrap.dedent(
    """\
    name: refs
    resources: {gpus_per_node: 0}
    services:
      - name: workers
        nodes: 2
        command: [echo, "{pool_ip:sched} {pool_ips:sched} {pool_node:sched}"]
        env: {PEERS: "{pool_nodes:workers}/{pool_node_count:workers}", OWN: "{pool_ip}"}
      - name: sched
        nodes: 1
        command: [echo, "{pool_ip}"]
      - name: rider
        placement: {pool: workers}
        command: [echo, "{pool_ip:sched}"]
    benchmark: {type: custom, command: "true"}
    """
)


def test_other_pools_addresses_render_in_command_and_env() -> None:
    _, state = plan_text_source(RECIPE, "r.yaml")
    sched = [s for s in state.instances if s.service == "sched"]
    assert [s.node_ip for s in sched] == ["127.0.0.4"]  # workers carve first: node1, node2
    for spec in (s for s in state.instances if s.service == "workers"):
        assert spec.argv == ("echo", "127.0.0.4 127.0.0.4 node3")
        env = dict(spec.env)
        assert env["PEERS"] == "node1,node2/2"
        assert env["OWN"] == "127.0.0.2"  # its own pool's instance 0, as before
    riders = [s for s in state.instances if s.service == "rider"]
    assert riders and all(s.argv == ("echo", "127.0.0.4") for s in riders)


def test_unknown_pool_is_refused_with_its_line_and_the_pools(tmp_path: Path) -> None:
    text = RECIPE.replace("{pool_node:sched}", "{pool_node:shed}")
    with pytest.raises(RecipeError) as caught:
        plan_text_source(text, "r.yaml")
    message = str(caught.value)
    assert "r.yaml:6: services[0].command[1]: {pool_node:shed} names no pool" in message
    assert "(pools: sched, workers)" in message
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert main(["plan", str(recipe)]) == 2


def test_a_rider_is_no_pool() -> None:
    with pytest.raises(RecipeError, match=r"\{pool_ip:rider\} names no pool"):
        plan_text_source(
            RECIPE.replace("{pool_ip:sched} {pool_ips", "{pool_ip:rider} {pool_ips"), "r"
        )


def test_template_and_render_agree_on_pool_keys() -> None:
    values = {"pool_ip": "a", "pool_ip:x": "b", "pool_ip@x": "b"}
    text = "{pool_ip} {pool_ip:x} {pool_ip:y} {x:y} {{z}}"
    compiled = template(text, frozenset(values))
    assert compiled is not None
    assert compiled.format_map(values) == render(text, values) == "a b {pool_ip:y} {x:y} {{z}}"


def test_lint_knows_pool_keys() -> None:
    assert typos("{pool_ip:sched} {pool_node_count:a-b}") == []
    assert typos("{pool_ipp:sched}") == [("pool_ipp:sched", "pool_ip:sched")]
