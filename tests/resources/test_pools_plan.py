"""Pools in the plan: counts, carving, placement, placeholders (T-01..T-14, T-16, T-18).

Ported from the older system's `tests/test_pools.py` to srtr's pure API: `effective` for the
node counts, `carving.carve` for the node map, `expand.expand` for instances, and
`cli.main` for what `srtr plan` / `srtr dry-run` prints. Where srtr differs on purpose
(design.md), the test says so.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from srtr.cli import main
from srtr.resources.carving import CarveError, carve
from srtr.resources.effective import (
    allocation_size,
    effective_pool,
    effective_restart,
    engine_node_count,
    pool_services,
    services_node_count,
    total_nodes,
)
from srtr.resources.errors import RecipeError
from srtr.resources.expand import ExpandError, expand
from srtr.resources.loading import load_text
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Recipe

TOY = """\
name: toy
resources:
  gpus_per_node: 8
roles:
  agg:
    nodes: 1
    workers: 1
    gpus: 8
services:
  - name: train
    type: generic
    command: ["sleep", "infinity"]
    nodes: 2
    container: "ubuntu:24.04"
    critical: false
  - name: napper
    type: generic
    command: ["sleep", "infinity"]
    nodes: 1
    critical: false
  - name: watcher
    type: generic
    command: ["sleep", "infinity"]
    critical: false
    placement:
      pool: train
benchmark:
  type: custom
  command: "echo train pool: $SRT_SERVICE_TRAIN_NODES"
"""


def alloc(count: int) -> list[tuple[str, str]]:
    """n1..nN with IPs 10.0.0.1..10.0.0.N, in allocation order."""
    return [(f"n{k}", f"10.0.0.{k}") for k in range(1, count + 1)]


def recipe(text: str) -> Recipe:
    return load_text(textwrap.dedent(text))


def toy() -> Recipe:
    return load_text(TOY)


def service(r: Recipe, name: str):
    return next(s for s in r.services if s.name == name)


def nodes_of(state, service_name: str) -> list[str]:
    return [i.node for i in state.instances if i.service == service_name]


def more_services(text: str) -> str:
    """Extra `services:` entries, written flush left, indented to sit in TOY's list."""
    return textwrap.indent(textwrap.dedent(text), "  ")


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# --- T-01..T-05: counts and rules ------------------------------------------------------------


def test_toy_recipe_adds_up_to_four_nodes() -> None:  # T-01
    r = toy()
    assert engine_node_count(r) == 1
    assert [s.name for s in pool_services(r)] == ["train", "napper"]
    assert services_node_count(r) == 3
    assert total_nodes(r) == 4
    assert allocation_size(r) == 4
    assert effective_pool(service(r, "watcher")) == "train"
    assert effective_pool(service(r, "train")) == "train"
    assert effective_pool(service(r, "napper")) == "napper"


def test_existing_recipes_are_untouched() -> None:  # T-02
    bare = recipe("""\
        name: bare
        roles:
          agg:
            nodes: 1
        """)
    assert total_nodes(bare) == 1
    assert services_node_count(bare) == 0
    three = recipe("""\
        name: three
        roles:
          agg:
            nodes: 3
            command: ["python3", "-m", "http.server"]
        frontend:
          type: generic
          command: ["python3", "-m", "router"]
        """)
    assert engine_node_count(three) == 3
    assert total_nodes(three) == 3
    assert pool_services(three) == []
    # An empty recipe still needs one node to run anything at all.
    assert total_nodes(recipe("name: empty\n")) == 1


def test_services_only_pools_still_work_without_roles() -> None:  # T-03
    r = recipe("""\
        name: only
        frontend:
          type: none
        services:
          - name: train
            command: ["sleep", "infinity"]
            nodes: 2
          - name: napper
            command: ["sleep", "infinity"]
            nodes: 1
        """)
    assert engine_node_count(r) == 0
    assert services_node_count(r) == 3
    assert total_nodes(r) == 3


POOL_RULES = [
    (
        "rider on a ghost pool",
        """\
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: w
            command: [a]
            placement:
              pool: ghost
        """,
        "'ghost' names no service that declares nodes (pools: train)",
    ),
    (
        "rider with node and pool",
        """\
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: w
            command: [a]
            placement:
              node: workers
              pool: train
        """,
        "give either node or pool, not both",
    ),
    (
        "owner with a pool",
        """\
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: other
            command: [a]
            nodes: 1
            placement:
              pool: train
        """,
        "makes the service its own pool; drop placement.pool",
    ),
    (
        "owner on head",
        """\
        services:
          - name: train
            command: [a]
            nodes: 2
            placement:
              node: head
        """,
        "placement.node must be workers, meaning that pool (got 'head')",
    ),
    (
        "frontend none next to an agg role",
        """\
        roles:
          agg:
            nodes: 1
        frontend:
          type: none
        """,
        "none is only supported without engine roles",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [r[1:] for r in POOL_RULES], ids=[r[0] for r in POOL_RULES]
)
def test_pool_rules(text: str, message: str) -> None:  # T-04
    with pytest.raises(RecipeError) as info:
        load_text("name: t\n" + textwrap.dedent(text))
    messages = [p.message for p in info.value.problems]
    assert any(message in m for m in messages), messages


def test_pools_are_refused_on_heterogeneous_jobs() -> None:  # T-05
    with pytest.raises(RecipeError) as info:
        recipe("""\
            name: het
            resources:
              het_jobs: true
            services:
              - name: train
                command: [a]
                nodes: 2
            """)
    (problem,) = info.value.problems
    assert "not supported together with resources.het_jobs" in problem.message
    assert problem.message.endswith("owners: train")
    # het_jobs without pools is fine
    recipe("name: het\nresources:\n  het_jobs: true\n")


# --- T-06..T-10: carving ---------------------------------------------------------------------


def test_carve_engine_nodes_first_then_pools_in_order() -> None:  # T-06
    nodes = carve(toy(), alloc(4))
    assert nodes.head == nodes.bench == nodes.infra == "n1"
    assert nodes.workers == ("n1",)
    assert nodes.pools == {"train": ("n2", "n3"), "napper": ("n4",)}
    assert list(nodes.pools) == ["train", "napper"]  # services: order
    assert nodes.compute == ("n1", "n2", "n3", "n4")
    assert nodes.reserved == () and nodes.spares == ()
    assert nodes.role_nodes == {"agg": ("n1",)}
    assert [(n.name, n.ip, n.role) for n in nodes.allocation] == [
        ("n1", "10.0.0.1", "worker"),
        ("n2", "10.0.0.2", "pool:train"),
        ("n3", "10.0.0.3", "pool:train"),
        ("n4", "10.0.0.4", "pool:napper"),
    ]


def test_carve_with_a_dedicated_frontend_node() -> None:  # T-07 (srtr has no infra kinds)
    r = load_text(TOY.replace("roles:", "frontend:\n  dedicated_node: true\nroles:"))
    assert allocation_size(r) == 5
    nodes = carve(r, alloc(5))
    assert nodes.reserved == ("n1",)
    assert nodes.head == nodes.bench == nodes.infra == "n1"  # the frontend runs on it
    assert nodes.workers == ("n2",)
    assert nodes.pools == {"train": ("n3", "n4"), "napper": ("n5",)}
    assert "n1" not in nodes.compute
    assert nodes.allocation[0].role == "dedicated"


def test_carve_with_a_dedicated_client_node() -> None:  # T-07, client flavour
    r = load_text(TOY.replace("  type: custom", "  type: custom\n  client_dedicated_node: true"))
    nodes = carve(r, alloc(5))
    # The client takes the last node (the batch script runs on the first).
    assert nodes.reserved == ("n5",)
    assert nodes.bench == "n5"
    assert nodes.head == nodes.infra == "n1"
    assert nodes.workers == ("n1",)
    assert nodes.pools == {"train": ("n2", "n3"), "napper": ("n4",)}
    assert nodes.compute == ("n1", "n2", "n3", "n4")


def test_carve_services_only_puts_the_head_on_the_first_pool_node() -> None:  # T-08
    r = recipe("""\
        name: only
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: napper
            command: [a]
            nodes: 1
        """)
    nodes = carve(r, alloc(3))
    assert nodes.workers == ()
    assert nodes.head == nodes.bench == "n1"
    assert nodes.pools == {"train": ("n1", "n2"), "napper": ("n3",)}
    assert nodes.compute == ("n1", "n2", "n3")
    assert nodes.role_nodes == {}


def test_carve_legacy_recipes_keep_every_node_as_a_worker() -> None:  # T-09
    r = recipe("""\
        name: legacy
        roles:
          agg:
            nodes: 2
            command: [w]
        """)
    nodes = carve(r, alloc(3))
    assert nodes.workers == ("n1", "n2", "n3")
    assert nodes.pools == {}
    assert nodes.compute == nodes.workers
    assert nodes.spares == ()
    # the role itself only holds the nodes it asked for
    assert nodes.role_nodes == {"agg": ("n1", "n2")}


def test_carve_with_pools_leaves_extra_nodes_as_spares() -> None:
    nodes = carve(toy(), alloc(6))
    assert nodes.spares == ("n5", "n6")
    assert nodes.compute == ("n1", "n2", "n3", "n4")
    assert [n.role for n in nodes.allocation][4:] == ["spare", "spare"]


def test_carve_rejects_a_short_allocation() -> None:  # T-10
    with pytest.raises(CarveError) as info:
        carve(toy(), alloc(3))
    assert str(info.value) == "allocation has 3 non-reserved node(s) but the recipe needs 4"


def test_carve_counts_only_non_reserved_nodes() -> None:  # T-10
    r = load_text(TOY.replace("roles:", "frontend:\n  dedicated_node: true\nroles:"))
    with pytest.raises(CarveError) as info:
        carve(r, alloc(4))
    assert str(info.value) == "allocation has 3 non-reserved node(s) but the recipe needs 4"
    with pytest.raises(CarveError, match="require at least 2 nodes"):
        carve(r, alloc(1))


def test_het_jobs_with_pools_are_refused_before_carving() -> None:  # T-10, het half
    # srtr refuses het_jobs + pools when loading, so carving never sees such a recipe.
    with pytest.raises(RecipeError, match="het_jobs"):
        load_text(TOY.replace("resources:", "resources:\n  het_jobs: true"))


# --- T-11..T-13: placement and placeholders ---------------------------------------------------


def test_service_nodes_follow_pools() -> None:  # T-11
    extra = more_services("""\
          - name: onworkers
            command: [a]
            placement:
              node: workers
          - name: oncompute
            command: [a]
            placement:
              node: compute
          - name: onall
            command: [a]
            placement:
              node: all
          - name: onhead
            command: [a]
            placement:
              node: head
          - name: onagg
            command: [a]
            placement:
              node: agg
        """)
    text = TOY.replace("benchmark:", extra + "benchmark:")
    r = load_text(text)
    state = expand(r, alloc(4))
    assert nodes_of(state, "train") == ["n2", "n3"]
    assert nodes_of(state, "napper") == ["n4"]
    assert nodes_of(state, "watcher") == ["n2", "n3"]
    assert nodes_of(state, "onworkers") == ["n1"]
    assert nodes_of(state, "oncompute") == ["n1", "n2", "n3", "n4"]
    assert nodes_of(state, "onall") == ["n1", "n2", "n3", "n4"]
    assert nodes_of(state, "onhead") == ["n1"]
    assert nodes_of(state, "onagg") == ["n1"]
    # riders sit next to the owner's instances, in the same order
    train = [i for i in state.instances if i.service == "train"]
    watcher = [i for i in state.instances if i.service == "watcher"]
    assert [(i.index, i.node) for i in watcher] == [(i.index, i.node) for i in train]
    assert {i.pool for i in watcher} == {"train"}


def test_spare_nodes_run_nothing() -> None:  # T-11, srtr: nodes beyond the recipe are spares
    state = expand(toy(), alloc(6))
    used = {i.node for i in state.instances}
    assert used.isdisjoint({"n5", "n6"})
    assert state.nodes.spares == ("n5", "n6")


def test_pool_placeholders_point_at_the_pool_not_the_job_head() -> None:  # T-12
    sft = more_services("""\
          - name: sft
            type: generic
            start: before_workers
            placement:
              pool: train
            command:
              - torchrun
              - --nnodes={pool_node_count}
              - --nproc-per-node={gpus_per_node}
              - --node-rank={index}
              - --master-addr={pool_ip}
              - --master-port=29500
              - --peers={pool_ips}
              - --first={pool_node}
              - --all={pool_nodes}
              - --job-head={head_ip}
            env:
              RANK_HINT: "{index}/{pool_node_count}"
              NCCL_SOCKET_IFNAME: bond0
        """)
    state = expand(load_text(TOY.replace("benchmark:", sft + "benchmark:")), alloc(4))
    instances = [i for i in state.instances if i.service == "sft"]
    assert [i.node for i in instances] == ["n2", "n3"]
    for rank, inst in enumerate(instances):
        assert inst.argv == (
            "torchrun",
            "--nnodes=2",
            "--nproc-per-node=8",
            f"--node-rank={rank}",
            "--master-addr=10.0.0.2",
            "--master-port=29500",
            "--peers=10.0.0.2,10.0.0.3",
            "--first=n2",
            "--all=n2,n3",
            "--job-head=10.0.0.1",
        )
        assert dict(inst.env) == {"RANK_HINT": f"{rank}/2", "NCCL_SOCKET_IFNAME": "bond0"}
        assert inst.stage == "before_workers/sft"
        assert inst.node_ip == f"10.0.0.{rank + 2}"


def test_single_instance_services_see_themselves_as_the_pool() -> None:  # T-13
    r = recipe("""\
        name: single
        roles:
          agg:
            nodes: 1
            command: [w]
        services:
          - name: solo
            command: ["x", "{pool_ip}", "{node_ip}", "{pool_nodes}", "{pool_node_count}", "{index}"]
        """)
    state = expand(r, alloc(1))
    (solo,) = [i for i in state.instances if i.service == "solo"]
    assert solo.node == "n1"
    assert solo.argv == ("x", "10.0.0.1", "10.0.0.1", "n1", "1", "0")


# --- T-14, T-16, T-18: the printed plan and terminal rules ------------------------------------


def test_dry_run_prints_the_node_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TOY)  # T-14
    assert main(["dry-run", path]) == 0
    out = capsys.readouterr().out
    assert "Nodes:\n  engine roles: 1\n  pool train (generic): 2\n" in out
    assert "  pool napper (generic): 1\n  total: 4\n" in out
    assert "  Pool train: node2, node3\n" in out
    assert "  Pool napper: node4\n" in out
    assert "  Worker nodes: node1\n" in out
    # plan is the same command
    assert main(["plan", path]) == 0
    assert capsys.readouterr().out == out


def test_dry_run_without_pools_prints_no_node_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # T-14 (S-121: the map needs an owner)
    path = write(tmp_path, "name: plain\nroles:\n  agg:\n    nodes: 2\n    command: [w]\n")
    assert main(["plan", path]) == 0
    out = capsys.readouterr().out
    assert "Nodes:" not in out
    assert "Worker nodes: node1, node2" in out


def test_dry_run_nodelist_names_the_real_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, TOY)
    assert main(["plan", path, "--nodelist", "gpu[01-05]"]) == 0
    out = capsys.readouterr().out
    assert "Allocation: 5 node(s); head gpu01; spares gpu05" in out
    assert "  Pool train: gpu02, gpu03\n" in out
    assert "service_train_gpu02" in out and "service_napper " in out


TERMINAL = """\
name: term
frontend:
  type: none
services:
  - name: train
    command: ["sleep", "1"]
    nodes: 2
    terminal: true
"""


def test_terminal_rules() -> None:  # T-16
    r = load_text(TERMINAL)
    assert r.benchmark.type == "manual"
    state = expand(r, alloc(2))
    assert state.terminal_services == ("train",)
    assert all(i.terminal for i in state.instances if i.service == "train")
    assert not any(i.name == "benchmark" for i in state.instances)

    with pytest.raises(RecipeError) as info:
        load_text(TERMINAL + "benchmark:\n  type: custom\n  command: echo hi\n")
    (problem,) = info.value.problems
    assert "cannot also run benchmark.type: custom" in problem.message
    assert problem.path == ("benchmark", "type")

    # srtr's own rule in place of "terminal + external" (srtr has no external services)
    with pytest.raises(RecipeError) as info:
        load_text(TERMINAL + "    restart: always\n")
    (problem,) = info.value.problems
    assert "restart: always would never let the job end" in problem.message


def test_two_terminal_services_compose() -> None:  # T-16
    text = TERMINAL + "  - name: eval\n    command: [a]\n    nodes: 1\n    terminal: true\n"
    state = expand(load_text(text), alloc(3))
    assert state.terminal_services == ("train", "eval")


def test_dry_run_marks_terminal_services(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # T-18
    assert main(["dry-run", write(tmp_path, TERMINAL)]) == 0
    out = capsys.readouterr().out
    assert "nodes=2 terminal" in out
    assert "Benchmark: manual; the job waits for terminal service(s): train" in out


# --- where srtr differs from the older system on purpose (design.md) -------------------------


def test_riders_default_to_restart_on_failure_everything_else_never() -> None:
    r = toy()
    assert effective_restart(service(r, "watcher")).policy == "on-failure"
    assert effective_restart(service(r, "train")).policy == "never"
    state = expand(r, alloc(4))
    policies = {i.service: i.restart.policy for i in state.instances}
    assert policies == {
        "train": "never",
        "napper": "never",
        "watcher": "on-failure",
        "benchmark": "never",
    }


def test_riders_inherit_their_owners_shutdown_tier() -> None:
    text = TOY.replace("    nodes: 2\n", "    nodes: 2\n    start: before_workers\n")
    state = expand(load_text(text), alloc(4))
    tiers = {i.service: i.shutdown_tier for i in state.instances}
    assert tiers["train"] == 1 and tiers["watcher"] == 1
    assert tiers["napper"] == 0


def test_services_do_not_get_the_top_level_environment() -> None:
    text = TOY + "environment:\n  NCCL_DEBUG: INFO\n"
    text = text.replace("  agg:\n    nodes: 1\n", "  agg:\n    nodes: 1\n    command: [w]\n")
    state = expand(load_text(text), alloc(4))
    for inst in state.instances:
        if inst.service in ("train", "napper", "watcher"):
            assert "NCCL_DEBUG" not in dict(inst.env), inst.name
    assert dict(state.instance("worker_agg_0").env)["NCCL_DEBUG"] == "INFO"
    assert dict(state.benchmark_env)["NCCL_DEBUG"] == "INFO"


def test_no_implied_exporters_unless_asked() -> None:
    state = expand(toy(), alloc(4))
    assert {i.service for i in state.instances} == {"train", "napper", "watcher", "benchmark"}
    assert state.exporters == ()
    r = load_text(TOY + "observability:\n  exporters: true\n")
    state = expand(r, alloc(4))
    assert nodes_of(state, "node-exporter") == ["n1", "n2", "n3", "n4"]  # compute
    assert nodes_of(state, "dcgm-exporter") == ["n1", "n2", "n3", "n4"]
    urls = sorted(e.url for e in state.exporters)
    assert "http://10.0.0.3:9101/metrics" in urls and "http://10.0.0.4:9401/metrics" in urls
    assert nodes_of(state, "process-exporter") == ["n1", "n2", "n3", "n4"]  # all
    assert len(state.exporters) == 12


def test_all_instances_of_a_service_launch_as_one_stage() -> None:
    state = expand(toy(), alloc(4))
    stages = [(s.name, s.phase, s.instances) for s in state.stages]
    assert stages == [
        ("after_frontend/train", "after_frontend", ("service_train_n2", "service_train_n3")),
        ("after_frontend/napper", "after_frontend", ("service_napper",)),
        ("after_frontend/watcher", "after_frontend", ("service_watcher_n2", "service_watcher_n3")),
        ("benchmark", "benchmark", ("benchmark",)),
    ]


def test_instance_names_and_logs_follow_the_seed() -> None:
    state = expand(toy(), alloc(4))
    names = [i.name for i in state.instances]
    assert names == [
        "service_train_n2",
        "service_train_n3",
        "service_napper",  # a one-node pool is unsuffixed
        "service_watcher_n2",
        "service_watcher_n3",
        "benchmark",
    ]
    assert state.instance("service_napper").log == "logs/service_napper.out"
    assert state.instance("service_train_n3").log == "logs/service_train_n3.out"


def test_worker_logs_are_named_as_srtctl_names_them() -> None:
    """`<node>_<role>_w<index>.out` (srtctl's worker stage); the instance keeps its name."""
    text = textwrap.dedent("""\
        name: w
        roles:
          prefill: {nodes: 1, workers: 1, command: [p]}
          decode: {nodes: 2, workers: 4, command: [d]}
        """)
    state = expand(load_text(text), alloc(3))
    workers = [(i.name, i.log) for i in state.instances if i.kind == "worker"]
    assert workers == [
        ("worker_prefill_0", "logs/n1_prefill_w0.out"),
        ("worker_decode_0", "logs/n2_decode_w0.out"),
        ("worker_decode_1", "logs/n2_decode_w1.out"),
        ("worker_decode_2", "logs/n3_decode_w2.out"),
        ("worker_decode_3", "logs/n3_decode_w3.out"),
    ]


def test_instance_names_never_collide() -> None:
    """Service `a` on node n2 and a one-instance service `a_n2` would both be
    `service_a_n2` (one step name, one log file): the plan must not hand out that name twice.
    """
    text = textwrap.dedent("""\
        name: clash
        services:
          - name: a
            command: [x]
            nodes: 2
          - name: a_n2
            command: [y]
        """)
    try:
        state = expand(load_text(text), alloc(2))
    except ExpandError as exc:  # refused: fine, as long as it says which name and where
        (problem,) = exc.problems
        assert problem.path == ("services", 1, "name")
        assert "'service_a_n2'" in problem.message
        with pytest.raises(RecipeError) as info:
            plan_text_source(text, "clash.yaml", alloc(2))
        assert info.value.lines()[0].startswith("clash.yaml:6: services[1].name: ")
    else:  # or renamed: then every name is unique
        names = [i.name for i in state.instances]
        assert len(names) == len(set(names)), names
