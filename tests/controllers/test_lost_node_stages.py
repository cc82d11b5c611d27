"""A node lost while the launch stages are still under way: the later stages' members on
it are Lost too, never launched in a loop there, and the job goes on with what it has."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from tests.support.controller_harness import Harness

# As benchmarks/largest.py's recipe, in small: riders of a pool on every node, restarted at
# once on failure. side2 has a probe so that a test can lose a node while its stage is open.
STAGES = """
name: t
services:
  - name: base
    command: [sleep, inf]
    nodes: 3
    restart: {policy: on-failure, backoff_seconds: 0}
  - name: side1
    command: [sleep, inf]
    placement: {pool: base}
    restart: {policy: on-failure, backoff_seconds: 0}
  - name: side2
    command: [sleep, inf]
    placement: {pool: base}
    restart: {policy: on-failure, backoff_seconds: 0}
    readiness: {port: 9000, timeout_seconds: 60, interval_seconds: 1}
  - name: side3
    command: [sleep, inf]
    placement: {pool: base}
    restart: {policy: on-failure, backoff_seconds: 0}
"""

SIDE2 = [f"service_side2_node{k}" for k in (1, 2, 3)]


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def _lost_during_stage_2(h: Harness) -> None:
    await h.settle()
    assert h.backend.launched("service_side2_node2") == 1
    assert h.backend.launched("service_side3_node2") == 0  # stage side2's gate is open
    h.backend.node_down("node2")
    await h.settle()
    for name in ("service_base_node2", "service_side1_node2", "service_side2_node2"):
        assert h.phase(name) == "Lost"
    h.prober.ready.update(SIDE2)
    await h.advance(1)


def test_a_later_stage_member_on_a_lost_node_is_lost_not_relaunched(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(STAGES, tmp_path)
        await _lost_during_stage_2(h)
        assert h.phase("service_side3_node2") == "Lost"
        assert h.store.status["service_side3_node2"].exit_code is None  # not "exited 127"
        rider = h.reasons("instance/service_side3_node2")
        assert "BackOff" not in rider and "Restarting" not in rider
        assert "NodeLost" in rider
        await h.advance(60)
        assert h.store.status["service_side3_node2"].attempt == 0  # tried once, no loop
        assert h.phase("service_side3_node2") == "Lost"

    run(body())


def test_the_job_runs_on_without_the_lost_node(tmp_path: Path) -> None:
    """As when a node is lost after every stage passed: not critical, no spare, the job goes
    on with the other nodes."""

    async def body() -> None:
        h = Harness(STAGES, tmp_path)
        await _lost_during_stage_2(h)
        assert h.phase("service_side3_node1") == "Running"
        assert h.phase("service_side3_node3") == "Running"
        assert h.store.job.phase == "Running"
        assert not h.store.job.teardown_requested

    run(body())


SPARE = STAGES.replace("    nodes: 3\n", "    nodes: 3\n    replace_lost: true\n")


def test_a_spare_takes_the_lost_node_with_the_later_stages_members(tmp_path: Path) -> None:
    """With a spare, the later stage's member on the lost node waits for it as the lost
    members of the earlier stages do: the spare runs all four once the node is fenced."""

    async def body() -> None:
        h = Harness(SPARE, tmp_path, nodes=4)
        h.store.recipe_text = textwrap.dedent(SPARE)
        await h.settle()
        assert h.store.desired.nodes.spares == ("node4",)
        h.backend.node_down("node2", fenced_in=7.5)
        await h.settle()
        h.prober.ready.update(SIDE2)
        await h.advance(1)
        assert h.phase("service_side3_node2") == "Lost"
        assert "BackOff" not in h.reasons("instance/service_side3_node2")
        assert h.backend.launched("service_base_node4") == 0  # node2 is not fenced yet
        assert not h.store.job.teardown_requested
        await h.advance(7)
        assert "Replaced" in h.reasons("pool/base")
        assert h.store.desired.nodes.pools["base"] == ("node1", "node4", "node3")
        for service in ("base", "side1", "side2", "side3"):
            assert f"service_{service}_node2" not in h.store.specs
        for service in ("base", "side1", "side2"):
            assert h.backend.launched(f"service_{service}_node4") == 1
        assert h.backend.launched("service_side3_node4") == 0  # after side2 there is ready
        h.prober.ready.add("service_side2_node4")
        await h.advance(1)
        assert h.backend.launched("service_side3_node4") == 1
        assert h.phase("service_side3_node4") == "Running"
        assert h.store.job.phase == "Running"

    run(body())


def test_a_restart_due_on_a_node_lost_meanwhile_is_lost(tmp_path: Path) -> None:
    """An instance in its backoff when its node goes is not among the node's running
    instances: its restart finds the node lost, and it is Lost too, not relaunched."""

    async def body() -> None:
        h = Harness(STAGES.replace("backoff_seconds: 0", "backoff_seconds: 5"), tmp_path)
        h.prober.ready.update(SIDE2)
        await h.advance(1)
        assert h.store.job.phase == "Running"
        h.exit("service_side1_node2", 1)
        await h.settle()
        assert h.phase("service_side1_node2") == "BackOff"
        h.backend.node_down("node2")
        await h.advance(5)
        assert h.phase("service_side1_node2") == "Lost"
        assert h.store.status["service_side1_node2"].attempt == 1
        await h.advance(60)
        assert h.store.status["service_side1_node2"].attempt == 1
        assert not h.store.job.teardown_requested

    run(body())
