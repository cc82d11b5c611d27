"""Services-only jobs in the plan: no engine roles, no frontend (reference T-20..T-25, T-31).

T-24 (`get_frontend("none")`) and T-26..T-30 (preflight topology, mock sweep, tachometer)
have no counterpart in srtr's pure plan; the frontend-less shape is checked here instead.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from srtr.cli import main
from srtr.resources.effective import (
    engine_node_count,
    frontend_type,
    roles,
    services_node_count,
    total_nodes,
)
from srtr.resources.errors import RecipeError
from srtr.resources.expand import ExpandError, expand
from srtr.resources.loading import load_text

FILES = """\
name: files-only
frontend:
  type: none
services:
  - name: files
    type: generic
    command: ["python3", "-m", "http.server", "9911", "--bind", "{node_ip}"]
    placement:
      node: workers
    nodes: 2
    start: before_workers
    readiness:
      port: 9911
      timeout_seconds: 30
benchmark:
  type: custom
  command: "python3 -c 'print(1)'"
"""


def alloc(count: int, prefix: str = "node") -> list[tuple[str, str]]:
    return [(f"{prefix}{k}", f"10.0.0.{k}") for k in range(1, count + 1)]


def with_services(extra: str, base: str = FILES) -> str:
    """`base` with more `services:` entries (written flush left) before its benchmark."""
    return base.replace("benchmark:", textwrap.indent(textwrap.dedent(extra), "  ") + "benchmark:")


def test_services_only_node_count() -> None:  # T-20
    r = load_text(FILES)
    assert total_nodes(r) == 2
    assert services_node_count(r) == 2
    assert engine_node_count(r) == 0
    assert roles(r) == []
    assert frontend_type(r) == "none"
    state = expand(r, alloc(2))
    kinds = {str(i.kind) for i in state.instances}
    assert kinds == {"owner", "benchmark"}  # no workers, no frontend
    assert state.nodes.workers == () and state.nodes.role_nodes == {}
    assert state.frontend_type == "none"


def test_services_only_without_an_owner_is_one_node() -> None:  # T-21
    r = load_text(
        "name: one\nservices:\n  - name: s\n    command: [a]\n    placement:\n      node: head\n"
    )
    assert total_nodes(r) == 1
    state = expand(r, alloc(1))
    assert [(i.name, i.node) for i in state.instances] == [("service_s", "node1")]
    assert state.node_summary == ()  # no owner: no node map


def test_agg_recipes_are_unchanged() -> None:  # T-21
    r = load_text("name: agg\nroles:\n  agg:\n    nodes: 3\n    command: [w]\n")
    assert total_nodes(r) == 3
    assert frontend_type(r) == "generic"


def test_owner_rules_and_counts() -> None:  # T-22
    with pytest.raises(RecipeError) as info:
        load_text(FILES.replace("nodes: 2", "nodes: 0"))
    assert [p.message for p in info.value.problems] == ["must be at least 1; got 0"]

    with pytest.raises(RecipeError) as info:
        load_text(FILES.replace("node: workers", "node: head"))
    (problem,) = info.value.problems
    assert "placement.node must be workers" in problem.message

    two = load_text(with_services("- name: more\n  command: [a]\n  nodes: 2\n"))
    assert total_nodes(two) == 4

    next_to_agg = load_text(
        FILES.replace("frontend:\n  type: none\n", "roles:\n  agg:\n    nodes: 1\n")
    )
    assert total_nodes(next_to_agg) == 3
    assert frontend_type(next_to_agg) == "generic"


def test_frontend_none_rules() -> None:  # T-23
    with pytest.raises(RecipeError) as info:
        load_text(FILES.replace("frontend:", "roles:\n  agg:\n    nodes: 1\nfrontend:"))
    (problem,) = info.value.problems
    assert problem.path == ("frontend", "type")
    assert "only supported without engine roles" in problem.message

    with pytest.raises(RecipeError) as info:
        load_text(FILES.replace("  type: none\n", "  type: none\n  dedicated_node: true\n"))
    (problem,) = info.value.problems
    assert problem.path == ("frontend", "dedicated_node")
    assert "dedicated_node is invalid" in problem.message


def test_frontend_none_runs_no_frontend() -> None:  # T-24, srtr's form
    with pytest.raises(RecipeError) as info:
        load_text(FILES.replace("  type: none\n", "  type: none\n  command: [f]\n"))
    (problem,) = info.value.problems
    assert problem.message == "frontend.type: none runs no frontend command"
    # frontend defaults to none without roles, to generic with them
    r = load_text(FILES.replace("frontend:\n  type: none\n", ""))
    assert frontend_type(r) == "none"
    assert not any(i.name == "frontend" for i in expand(r, alloc(2)).instances)


def test_dry_run_mentions_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # T-25
    path = tmp_path / "files.yaml"
    path.write_text(FILES)
    assert main(["dry-run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  files type=generic placement=workers start=before_workers" in out
    assert "nodes=2" in out
    assert "  Worker nodes: (none: no engine roles)\n" in out
    assert "Benchmark env:\n" in out
    assert "service_files_node1" in out and "service_files_node2" in out
    assert main(["dry-run", str(path), "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["benchmark"]["type"] == "custom"
    assert plan["nodes"] == {"engine roles": 0, "pool files (generic)": 2, "total": 2}
    probes = [i["probe"] for i in plan["instances"] if i["service"] == "files"]
    assert probes == ["tcp 127.0.0.2:9911", "tcp 127.0.0.3:9911"]


def test_services_only_head_is_the_first_pool_node() -> None:
    state = expand(load_text(FILES), alloc(3))
    assert state.nodes.head == "node1"
    assert state.instance("benchmark").node == "node1"
    assert state.nodes.spares == ("node3",)


def test_custom_benchmark_env() -> None:  # T-31
    state = expand(load_text(FILES), alloc(2))
    env = dict(state.benchmark_env)
    assert env["SRT_SERVICE_FILES_NODES"] == "node1,node2"
    assert env["SRT_SERVICE_FILES_IPS"] == "10.0.0.1,10.0.0.2"
    assert env["SRT_SERVICE_FILES_NODE_COUNT"] == "2"
    assert env["SRT_GPUS_PER_NODE"] == "8"
    assert env["SRT_WORKER_NODES"] == ""
    assert env["SRT_FRONTEND_TYPE"] == "none"
    assert "SRT_FRONTEND_HOST" not in env
    assert "SRT_FRONTEND_PORT" not in env
    assert dict(state.instance("benchmark").env) == env
    assert state.instance("benchmark").shell is True


def test_benchmark_env_keys_and_layering() -> None:  # T-31, S-100/S-101
    text = with_services("""\
        - name: my-sidecar_v2
          command: [a]
          placement:
            pool: files
        - name: unused
          command: [a]
          enabled: false
        """)
    text += "environment:\n  SRT_GPUS_PER_NODE: '4'\n  TOP: t\n"
    text = text.replace('  command: "python3', '  env:\n    TOP: bench\n  command: "python3')
    env = dict(expand(load_text(text), alloc(2)).benchmark_env)
    assert env["SRT_SERVICE_MY_SIDECAR_V2_NODES"] == "node1,node2"
    assert not any(k.startswith("SRT_SERVICE_UNUSED_") for k in env)  # disabled: not launched
    assert env["SRT_GPUS_PER_NODE"] == "4"  # environment: overrides the generated values
    assert env["TOP"] == "bench"  # benchmark.env last


def test_worker_nodes_are_the_engine_roles_nodes() -> None:  # T-31, srtr: engine roles only
    text = (
        "name: mixed\nroles:\n  prefill:\n    nodes: 1\n    command: [p]\n"
        "  decode:\n    nodes: 2\n    command: [d]\n"
        "services:\n  - name: pool\n    command: [a]\n    nodes: 1\n"
        "benchmark:\n  type: custom\n  command: 'true'\n"
    )
    env = dict(expand(load_text(text), alloc(4)).benchmark_env)
    assert env["SRT_WORKER_NODES"] == "node1,node2,node3"
    assert env["SRT_PREFILL_NODES"] == "node1"
    assert env["SRT_DECODE_IPS"] == "10.0.0.2,10.0.0.3"
    assert env["SRT_SERVICE_POOL_NODES"] == "node4"


def test_benchmark_env_with_implied_exporters() -> None:  # T-31 + S-111
    env = dict(
        expand(load_text(FILES + "observability:\n  exporters: true\n"), alloc(2)).benchmark_env
    )
    assert env["SRT_SERVICE_NODE_EXPORTER_NODES"] == "node1,node2"
    assert env["SRT_SERVICE_DCGM_EXPORTER_NODE_COUNT"] == "2"


def test_t29_t30_exporter_targets_are_named_and_ordered_as_srtctls() -> None:
    """Targets from the services only, in the implied order dcgm, node, then process exporter,
    named `dcgm_<node>`, `node_exporter_<node>` and `process_exporter_<node>` (S-110, S-111)."""
    state = expand(load_text(FILES + "observability:\n  exporters: true\n"), alloc(2))
    assert [e.name for e in state.exporters] == [
        "dcgm_node1",
        "dcgm_node2",
        "node_exporter_node1",
        "node_exporter_node2",
        "process_exporter_node1",
        "process_exporter_node2",
    ]
    assert [s.name for s in state.stages] == [
        "before_workers/files",
        "after_frontend/dcgm-exporter",
        "after_frontend/node-exporter",
        "after_frontend/process-exporter",
        "benchmark",
    ]


def test_plan_shows_generated_node_lists_of_any_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A service called keycloak is not a secret: its generated node lists are shown."""
    path = tmp_path / "r.yaml"
    path.write_text(
        with_services("- name: keycloak\n  command: [a]\n  nodes: 1\n").replace(
            "name: files-only", "name: masked"
        )
    )
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "SRT_SERVICE_KEYCLOAK_NODES=node3\n" in out
    assert "SRT_SERVICE_KEYCLOAK_NODE_COUNT=1\n" in out


def test_plan_masks_secret_looking_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        FILES.replace('  command: "python3', '  env:\n    HF_TOKEN: hunter2\n  command: "python3')
    )
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "HF_TOKEN=***\n" in out and "hunter2" not in out
    assert main(["plan", str(path), "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["benchmark"]["env"]["HF_TOKEN"] == "***"


def test_services_whose_env_keys_collide_are_refused() -> None:
    text = textwrap.dedent("""\
        name: collide
        services:
          - name: a-b
            command: [x]
            nodes: 1
          - name: a_b
            command: [y]
            nodes: 2
        benchmark:
          type: custom
          command: "true"
        """)
    try:
        env = dict(expand(load_text(text), alloc(3)).benchmark_env)
    except (RecipeError, ExpandError):
        return  # refused: fine
    nodes = {k: v for k, v in env.items() if k.startswith("SRT_SERVICE_") and k.endswith("_NODES")}
    # Today only SRT_SERVICE_A_B_NODES=node2,node3 (a_b) is left; a-b's node1 is gone.
    assert sorted(nodes.values()) == ["node1", "node2,node3"], nodes
