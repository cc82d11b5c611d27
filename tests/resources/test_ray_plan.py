"""srtctl's Ray kind tests (reference §11.6, T-100..T-112) ported to srtr's recipe model.

Each test names the srtctl case it ports and keeps its expectation. Where srtr differs on
purpose it says so: the dashboard binds to the node's IP (`--dashboard-host={node_ip}`) rather
than 0.0.0.0, because simulated nodes share one network namespace (kinds/ray.py).
Plan-level cases run `expand`; the fleet gate runs as pure decisions (T-110), through the
controllers with a scripted prober, and its poll against real HTTP servers (T-109).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from srtr.controllers.fleet_decisions import fleet_gate
from srtr.net.fleet import alive_members, count_alive
from srtr.resources.expand import local_allocation
from srtr.resources.objects import DesiredState, InstanceSpec, ProbeKind, Stage
from srtr.resources.planning import plan_text_source
from srtr.store.status import InstanceStatus, Phase
from tests.resources.test_validation import problems
from tests.support.controller_harness import Harness

POOL = """
name: r
resources: {gpus_per_node: 8}
services:
  - name: train
    type: ray
    nodes: 3
"""
HEAD, N2, N3 = "service_train_node1", "service_train_node2", "service_train_node3"


def plan(text: str, nodes: int | None = None) -> DesiredState:
    allocation = local_allocation(nodes) if nodes else None
    return plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)[1]


def spec(state: DesiredState, name: str) -> InstanceSpec:
    return state.instance(name)


def script(inst: InstanceSpec) -> str:
    """A member's `bash -c` script (argv[2])."""
    assert inst.argv[:2] == ("bash", "-c"), inst.argv
    return inst.argv[2]


# --- T-100..T-108: the kind's defaults, argv, env, probes and rejections ------------------------


def test_t100_defaults_before_workers_critical_workers_no_ports() -> None:
    state = plan(
        """
        name: r
        roles: {agg: {nodes: 2, command: [w]}}
        frontend: {command: [f]}
        observability: {exporters: false}
        services:
          - name: ray
            type: ray
        """
    )
    ray = [s for s in state.instances if s.service == "ray"]
    assert [s.node for s in ray] == ["node1", "node2"]  # placement workers
    assert all(s.critical for s in ray)
    assert {s.stage for s in ray} == {"before_workers/ray"}
    assert [st.name for st in state.stages][:2] == ["before_workers/ray", "workers"]
    assert not [e for e in state.exporters if e.service == "ray"]  # no default metrics


def test_t101_head_argv() -> None:
    head = spec(plan(POOL), HEAD)
    assert head.argv == (
        "ray",
        "start",
        "--head",
        "--port=6379",
        "--dashboard-host=127.0.0.2",  # srtctl: 0.0.0.0 (see the module docstring)
        "--dashboard-port=8265",
        "--node-ip-address=127.0.0.2",
        "--num-gpus=8",
        "--disable-usage-stats",
        "--block",
    )


def test_t102_member_waits_for_the_head_then_joins() -> None:
    member = spec(plan(POOL), N3)
    text = script(member)
    assert "/dev/tcp/127.0.0.2/6379" in text
    assert "$(seq 60)" in text and "sleep 5" in text  # up to 60 × 5 s
    assert (
        "exec ray start --address=127.0.0.2:6379 --node-ip-address=127.0.0.4 --num-gpus=8 "
        '--disable-usage-stats --block "$@"'
    ) in text


def test_t103_options_and_args_flow_to_head_and_members() -> None:
    state = plan(
        """
        name: r
        services:
          - name: train
            type: ray
            nodes: 3
            options: {port: 7000, dashboard_port: 9000, num_gpus: 4}
            args: ["--object-store-memory=1000000000", "--resources={\\"x\\": 1}"]
        """
    )
    head, member = spec(state, HEAD), spec(state, N2)
    assert "--port=7000" in head.argv and "--dashboard-port=9000" in head.argv
    assert "--num-gpus=4" in head.argv
    assert head.argv[-2:] == ("--object-store-memory=1000000000", '--resources={"x": 1}')
    assert "/dev/tcp/127.0.0.2/7000" in script(member)
    assert "--address=127.0.0.2:7000" in script(member) and "--num-gpus=4" in script(member)
    # The args reach the member as "$@", never re-split by bash.
    assert member.argv[3:] == (
        "ray-join",
        "--object-store-memory=1000000000",
        '--resources={"x": 1}',
    )
    assert dict(head.env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert dict(member.env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_t104_default_env_and_the_recipe_wins() -> None:
    env = dict(spec(plan(POOL), HEAD).env)
    assert env == {"RAY_memory_monitor_refresh_ms": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    state = plan(POOL + "    env: {CUDA_VISIBLE_DEVICES: '3', EXTRA: '{node}'}\n")
    env = dict(spec(state, N2).env)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["EXTRA"] == "node2"
    assert env["RAY_memory_monitor_refresh_ms"] == "0"


def test_t105_readiness_per_role_and_recipe_override() -> None:
    state = plan(POOL)
    head, member = spec(state, HEAD).probe, spec(state, N2).probe
    assert head is not None and member is not None
    assert (head.kind, head.port, head.path, head.status) == (
        ProbeKind.HTTP,
        8265,
        "/api/version",
        200,
    )
    assert (member.kind, member.pattern) == (ProbeKind.LOG, "Ray runtime started")
    assert (head.timeout_seconds, head.interval_seconds) == (600, 5)
    assert (member.timeout_seconds, member.interval_seconds) == (600, 5)
    # A recipe's readiness replaces the kind's for every instance, as for any other kind.
    override = POOL + "    readiness: {port: 6379, timeout_seconds: 30, interval_seconds: 1}\n"
    state = plan(override)
    probes = {spec(state, n).probe for n in (HEAD, N2, N3)}
    assert len(probes) == 1
    (only,) = probes
    assert only is not None and (only.kind, only.port, only.timeout_seconds) == (
        ProbeKind.TCP,
        6379,
        30,
    )
    fleet = state.stages[0].fleet
    assert fleet is not None and (fleet.timeout_seconds, fleet.interval_seconds) == (30, 1)


def test_t106_preview_shows_the_node_ip_and_the_fleet_gate(tmp_path: Path) -> None:
    recipe = tmp_path / "ray.yaml"
    recipe.write_text(textwrap.dedent(POOL))
    out = subprocess.run(
        [sys.executable, "-m", "srtr", "plan", str(recipe)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--node-ip-address=127.0.0.2" in out
    assert "--node-ip-address=127.0.0.4" in out
    assert (
        "1. before_workers/train (3 instance(s)), then fleet gate: 3 live nodes at "
        "http://127.0.0.2:8265/nodes?view=summary"
    ) in out
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "srtr", "plan", "-o", "json", str(recipe)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert doc["stages"][0]["fleet"] == {
        "url": "http://127.0.0.2:8265/nodes?view=summary",
        "count": 3,
    }


def test_t107_loads_in_a_services_only_job_total_3() -> None:
    state = plan(POOL)
    assert dict(state.node_summary)["total"] == 3
    assert state.frontend_type == "none"
    assert [s.name for s in state.instances] == [HEAD, N2, N3]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "    placement: {node: infra}\n",
            (
                5,
                "services[0].placement.node",
                "type ray must be placed on head, workers, or all (or own or join a pool); "
                "got 'infra'",
            ),
        ),
        (
            "    command: [ray, start]\n",
            (
                6,
                "services[0].command",
                "type ray builds its own command (`ray start --head` on the first node, "
                "`ray start --address=<head>` on the others); add flags with args",
            ),
        ),
        (
            "    options: {port: '6379'}\n",
            (6, "services[0].options.port", "must be a positive integer; got '6379'"),
        ),
        (
            "    options: {num_gpus: 0}\n",
            (6, "services[0].options.num_gpus", "must be a positive integer; got 0"),
        ),
        (
            "    options: {dashbord_port: 1}\n",
            (
                6,
                "services[0].options",
                "has keys type 'ray' does not understand: dashbord_port",
            ),
        ),
    ],
)
def test_t108_rejections(extra: str, expected: tuple[int, str, str]) -> None:
    text = "name: r\nservices:\n  - name: ray\n    type: ray\n    placement: {node: workers}\n"
    if "placement" in extra:
        text = text.replace("    placement: {node: workers}\n", "")
    found = problems(text + extra)
    assert found == [expected]


def test_t108_placements_accepted() -> None:
    for where in ("head", "workers", "all"):
        plan(f"name: r\nservices:\n  - {{name: ray, type: ray, placement: {{node: {where}}}}}\n")


def test_t108_ray_rides_a_pool() -> None:
    state = plan(
        """
        name: r
        services:
          - {name: hosts, command: [sleep, infinity], nodes: 2}
          - {name: ray, type: ray, placement: {pool: hosts}}
        """
    )
    head = spec(state, "service_ray_node1")
    assert head.argv[:3] == ("ray", "start", "--head")
    assert "--address=127.0.0.2:6379" in script(spec(state, "service_ray_node2"))


# --- T-109: counting ALIVE raylets, tolerant of a dead dashboard --------------------------------


def summary(*states: str) -> bytes:
    nodes = [{"ip": f"127.0.0.{k + 2}", "raylet": {"state": s}} for k, s in enumerate(states)]
    return json.dumps({"result": True, "data": {"summary": nodes}}).encode()


def test_t109_counts_alive_raylets_only() -> None:
    assert count_alive(summary("ALIVE", "DEAD", "ALIVE")) == 2
    assert count_alive(summary()) == 0
    with pytest.raises(ValueError):
        count_alive(b'{"result": false, "msg": "boom"}')
    with pytest.raises(ValueError):
        count_alive(b"<html>")


@pytest.fixture
def dashboard() -> Iterator[tuple[str, list[tuple[int, bytes]]]]:
    """A real HTTP server on 127.0.0.1 answering each GET with the next scripted reply."""
    replies: list[tuple[int, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = replies.pop(0) if len(replies) > 1 else replies[0]
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/nodes?view=summary", replies
    finally:
        server.shutdown()
        server.server_close()


def test_t109_poll_answers_and_dead_dashboards(
    dashboard: tuple[str, list[tuple[int, bytes]]],
) -> None:
    url, replies = dashboard
    replies += [(500, b"oops"), (200, b"not json"), (200, summary("ALIVE", "ALIVE"))]
    assert asyncio.run(alive_members(url, 2)) == (None, f"{url} -> 500")
    alive, message = asyncio.run(alive_members(url, 2))
    assert alive is None and "not a node summary" in message
    assert asyncio.run(alive_members(url, 2)) == (2, f"{url}: 2 ALIVE")
    # Nothing listens on port 1: no answer is None, never an exception.
    alive, message = asyncio.run(alive_members("http://127.0.0.1:1/nodes?view=summary", 2))
    assert alive is None and "refused" in message.lower()


# --- T-110: the fleet gate --------------------------------------------------------------------


def statuses(state: DesiredState, exited: str | None = None) -> dict[str, InstanceStatus]:
    out = {}
    for inst in state.instances:
        status = InstanceStatus(phase=Phase.READY, attempt=0, ready_attempt=0, activated=True)
        if inst.name == exited:
            status.phase, status.exited_attempt, status.exit_code = Phase.FAILED, 0, 1
        out[inst.name] = status
    return out


def test_t110_gate_waits_then_times_out() -> None:
    state = plan(POOL)
    stage = state.stages[0]
    specs = {s.name: s for s in state.instances}
    ok = statuses(state)
    assert fleet_gate(stage, specs, ok, opened_at=None, alive=None, now=0).failed is None
    gate = fleet_gate(stage, specs, ok, opened_at=10, alive=1, now=20)
    assert gate.failed is None and gate.wake_in == 590
    gate = fleet_gate(stage, specs, ok, opened_at=10, alive=1, now=610)
    assert gate.reason == (
        "services[train]: only 1/3 Ray nodes alive after 600s "
        "(http://127.0.0.2:8265/nodes?view=summary)"
    )
    # A dashboard that never answered counts as none alive.
    gate = fleet_gate(stage, specs, ok, opened_at=10, alive=None, now=610)
    assert "only 0/3 Ray nodes alive after 600s" in gate.reason


def test_t110_fails_fast_when_a_member_exits() -> None:
    state = plan(POOL)
    specs = {s.name: s for s in state.instances}
    gate = fleet_gate(
        state.stages[0], specs, statuses(state, exited=N3), opened_at=10, alive=2, now=11
    )
    assert gate.failed == N3
    assert gate.reason == (
        "services[train] on node3 exited with code 1 while waiting for 3 Ray nodes to be "
        "alive (2/3 at http://127.0.0.2:8265/nodes?view=summary); see "
        "logs/service_train_node3.out"
    )
    assert "node3 exited" in gate.reason


def test_t110_no_gate_for_one_node() -> None:
    state = plan(POOL.replace("nodes: 3", "nodes: 1"))
    assert state.stages[0].fleet is None
    assert state.instances[0].argv[:3] == ("ray", "start", "--head")


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_t110_gate_holds_the_stage_until_all_alive(tmp_path: Path) -> None:
    """Through the controllers: 1, 2, then 3 alive → two more polls, then the next stage."""
    recipe = POOL + "  - {name: after, command: [sleep, infinity]}\n"

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        h.prober.fleet_answers = [1, 2, 3]
        await h.settle()
        h.prober.ready.update((HEAD, N2, N3))
        await h.advance(5)  # the members' probes pass; the gate opens and polls once
        assert h.prober.fleet_polls == 1 and h.backend.launched("service_after") == 0
        await h.advance(5)
        assert h.prober.fleet_polls == 2 and h.backend.launched("service_after") == 0
        await h.advance(5)
        assert h.prober.fleet_polls == 3
        assert h.backend.launched("service_after") == 1
        assert "FleetReady" in h.reasons("service/train")
        await h.advance(30)
        assert h.prober.fleet_polls == 3  # polling stopped once the gate passed

    run(body())


def test_t110_controllers_fail_the_job_when_a_member_exits(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL, tmp_path)
        h.prober.fleet_answers = [1]
        await h.settle()
        h.prober.ready.update((HEAD, N2, N3))
        await h.advance(5)
        h.exit(N3, 1)
        await h.settle()
        assert h.store.job.exit_code == 1
        assert h.store.job.reason.startswith("services[train] on node3 exited with code 1")
        assert not h.backend.live

    run(body())


def test_t110_controllers_time_out(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL, tmp_path)
        h.prober.fleet_answers = [None, 1]
        await h.settle()
        h.prober.ready.update((HEAD, N2, N3))
        await h.advance(5)
        await h.advance(599)
        assert not h.store.job.teardown_requested
        await h.advance(1)
        assert h.store.job.reason == (
            "services[train]: only 1/3 Ray nodes alive after 600s "
            "(http://127.0.0.2:8265/nodes?view=summary)"
        )

    run(body())


# --- T-111, T-112: the stage and where the head goes ------------------------------------------


def test_t111_one_stage_head_first_all_critical_one_fleet_gate() -> None:
    state = plan(POOL.replace("nodes: 3", "nodes: 3\n    container: img:1"))
    stage: Stage = state.stages[0]
    assert stage.instances == (HEAD, N2, N3)  # the head is launched first
    assert all(
        spec(state, n).critical and spec(state, n).container == "img:1" for n in stage.instances
    )
    probes = [spec(state, n).probe for n in stage.instances]
    assert [p.kind for p in probes if p] == [ProbeKind.HTTP, ProbeKind.LOG, ProbeKind.LOG]
    assert stage.fleet is not None and stage.fleet.count == 3
    assert [s.fleet for s in state.stages[1:]] == [None] * (len(state.stages) - 1)


def test_t112_head_is_the_pools_first_node_next_to_engine_roles() -> None:
    state = plan(
        """
        name: r
        roles: {agg: {nodes: 1, command: [w]}}
        frontend: {command: [f]}
        observability: {exporters: false}
        services:
          - {name: train, type: ray, nodes: 2}
        """
    )
    ray = [s for s in state.instances if s.service == "train"]
    assert [s.node for s in ray] == ["node2", "node3"]
    assert ray[0].argv[:3] == ("ray", "start", "--head")
    assert "--node-ip-address=127.0.0.3" in ray[0].argv
    assert "--address=127.0.0.3:6379" in script(ray[1])
    assert state.stages[0].fleet is not None
    assert state.stages[0].fleet.url == "http://127.0.0.3:8265/nodes?view=summary"
