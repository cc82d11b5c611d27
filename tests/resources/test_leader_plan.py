"""`leader:` of a pool owner: instance 0 runs the leader's command, args, env and probe; with
`start: first` it is a stage of its own before the other instances, with `together` it
launches with them; only owners have one."""

from __future__ import annotations

import textwrap

import pytest

from srtr.cli import main
from srtr.resources.errors import RecipeError
from srtr.resources.planning import plan_text_source

RECIPE = textwrap.dedent(
    """\
    name: lead
    resources: {gpus_per_node: 0}
    services:
      - name: dask
        nodes: 3
        command: [dask, worker, "tcp://{pool_ip}:8786"]
        args: [--nthreads, "2"]
        env: {ROLE: worker, SHARED: "yes"}
        readiness: {log: {pattern: "Starting Worker"}}
        leader:
          command: [dask, scheduler, --host, "{node_ip}"]
          env: {ROLE: scheduler}
          readiness: {tcp: {port: 8786}}
    benchmark: {type: custom, command: "true"}
    """
)


def by_name(state, service: str):
    return [s for s in state.instances if s.service == service]


def test_instance_0_runs_the_leader_and_the_others_the_service() -> None:
    _, state = plan_text_source(RECIPE, "r.yaml")
    leader, *rest = by_name(state, "dask")
    assert leader.node == "node1"
    assert leader.argv == ("dask", "scheduler", "--host", "127.0.0.2", "--nthreads", "2")
    assert dict(leader.env) == {"ROLE": "scheduler", "SHARED": "yes"}
    assert leader.probe is not None and leader.probe.port == 8786
    for spec in rest:
        assert spec.argv == ("dask", "worker", "tcp://127.0.0.2:8786", "--nthreads", "2")
        assert dict(spec.env) == {"ROLE": "worker", "SHARED": "yes"}
        assert spec.probe is not None and spec.probe.pattern == "Starting Worker"


def test_start_first_gives_the_leader_a_stage_before_the_others() -> None:
    _, state = plan_text_source(RECIPE, "r.yaml")
    stages = [(s.name, s.instances) for s in state.stages]
    assert stages[:2] == [
        ("after_frontend/dask.leader", ("service_dask_node1",)),
        ("after_frontend/dask", ("service_dask_node2", "service_dask_node3")),
    ]


def test_start_together_launches_all_in_one_stage() -> None:
    text = RECIPE.replace(
        "readiness: {tcp: {port: 8786}}", "readiness: {tcp: {port: 8786}}\n      start: together"
    )
    _, state = plan_text_source(text, "r.yaml")
    first = state.stages[0]
    assert (first.name, len(first.instances)) == ("after_frontend/dask", 3)
    assert by_name(state, "dask")[0].argv[1] == "scheduler"


def test_leader_args_replace_the_service_args() -> None:
    text = RECIPE.replace(
        "env: {ROLE: scheduler}", 'args: [--port, "8786"]\n      env: {ROLE: scheduler}'
    )
    _, state = plan_text_source(text, "r.yaml")
    assert by_name(state, "dask")[0].argv[-2:] == ("--port", "8786")
    assert by_name(state, "dask")[1].argv[-2:] == ("--nthreads", "2")


def test_with_workers_leader_first_starts_before_the_workers_stage() -> None:
    text = RECIPE.replace("nodes: 3", "nodes: 3\n    start: with_workers")
    _, state = plan_text_source(text, "r.yaml")
    stages = {s.name: s for s in state.stages}
    assert stages["with_workers/dask.leader"].instances == ("service_dask_node1",)
    assert stages["workers"].instances == ("service_dask_node2", "service_dask_node3")
    assert not by_name(state, "dask")[0].deferred_probe


def test_a_ray_pool_keeps_its_head_probe_under_a_leader_without_one() -> None:
    text = textwrap.dedent(
        """\
        name: r
        resources: {gpus_per_node: 0}
        services:
          - name: ray
            type: ray
            nodes: 2
            leader: {env: {HEAD: "1"}}
        """
    )
    _, state = plan_text_source(text, "r.yaml")
    head, member = by_name(state, "ray")
    assert "--head" in head.argv and ("HEAD", "1") in head.env
    assert head.probe is not None and head.probe.path == "/api/version"
    assert ("HEAD", "1") not in member.env


def test_plan_text_shows_the_leader(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    assert main(["plan", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "leader: instance 0 runs the leader, start=first" in out
    line = next(line for line in out.splitlines() if "service_dask_node1" in line)
    assert "node1" in line and "dask scheduler --host 127.0.0.2" in line


def test_only_owners_have_a_leader() -> None:
    text = RECIPE.replace("nodes: 3", "placement: {node: head}")
    with pytest.raises(
        RecipeError, match=r"r.yaml:\d+: services\[0\].leader: applies to pool owners"
    ):
        plan_text_source(text, "r.yaml")


def test_leader_start_is_first_or_together() -> None:
    text = RECIPE.replace(
        "readiness: {tcp: {port: 8786}}", "readiness: {tcp: {port: 8786}}\n      start: last"
    )
    with pytest.raises(RecipeError, match=r"leader.start"):
        plan_text_source(text, "r.yaml")


def test_the_leaders_liveness_replaces_the_services_on_instance_0_only() -> None:
    recipe = RECIPE.replace(
        "      readiness: {tcp: {port: 8786}}\n",
        "      readiness: {tcp: {port: 8786}}\n"
        '      liveness: {exec: {command: [dask-ping, "{node_ip}:8786"]}}\n',
    ).replace(
        '    readiness: {log: {pattern: "Starting Worker"}}\n',
        '    readiness: {log: {pattern: "Starting Worker"}}\n'
        "    liveness: {log: {silence_seconds: 60}}\n",
    )
    _, state = plan_text_source(recipe, "r.yaml")
    leader, *others = by_name(state, "dask")
    assert leader.index == 0 and leader.liveness is not None
    assert leader.liveness.command == ("dask-ping", f"{leader.node_ip}:8786")
    assert others and all(
        o.liveness is not None and o.liveness.silence_seconds == 60 for o in others
    )


def test_a_leaders_port_liveness_is_refused_where_instances_share_a_node() -> None:
    recipe = RECIPE.replace(
        "      readiness: {tcp: {port: 8786}}\n",
        "      readiness: {tcp: {port: 8786}}\n      liveness: {tcp: {port: 8786}}\n",
    ).replace("    nodes: 3\n", "    nodes: 3\n    placement: {per: worker}\n")
    with pytest.raises(RecipeError) as info:
        plan_text_source(recipe, "r.yaml")
    assert "services[0].leader.liveness" in str(info.value)
