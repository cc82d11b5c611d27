"""Controller tests (fake backend, fake clock) of a service's per-node `setup`: its stage gates
the service, a failure or a timeout on one node fails the job with that node's log, and a
node the service gains later runs its setup before its instance there. Plan level:
tests/resources/test_node_setup_plan.py; real processes: tests/e2e/local/test_node_setup.py."""

from __future__ import annotations

import asyncio
import signal
import textwrap
from collections.abc import Awaitable
from pathlib import Path

from srtr.controllers import edits, intents
from srtr.resources.diff import diff
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from tests.support.controller_harness import Harness

POOL = """
name: t
services:
  - name: pool
    nodes: {nodes}
    command: [work]
    setup: "echo {{node}} > /tmp/marker"
    setup_timeout_seconds: 30
"""
SETUPS = ["setup_pool_node1", "setup_pool_node2", "setup_pool_node3"]
INSTANCES = ["service_pool_node1", "service_pool_node2", "service_pool_node3"]


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def launched(h: Harness) -> list[str]:
    return [s.name for s in h.backend.launches]


def test_the_service_starts_once_every_node_s_setup_exited_zero(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=3), tmp_path, nodes=3)
        await h.settle()
        assert launched(h) == SETUPS
        spec = next(s for s in h.backend.launches if s.name == "setup_pool_node2")
        assert spec.argv == ("echo node2 > /tmp/marker",) and spec.shell
        h.exit("setup_pool_node1", 0)
        h.exit("setup_pool_node3", 0)
        await h.settle()
        assert launched(h) == SETUPS  # node2's setup still runs: nothing starts yet
        h.exit("setup_pool_node2", 0)
        await h.settle()
        assert launched(h) == SETUPS + INSTANCES
        assert [h.phase(n) for n in SETUPS] == ["Succeeded"] * 3
        await h.advance(60)  # a finished setup's timeout no longer counts
        assert not h.store.job.teardown_requested

    run(body())


def test_a_setup_that_fails_on_one_node_fails_the_job_naming_its_log(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=3), tmp_path, nodes=3)
        await h.settle()
        h.exit("setup_pool_node1", 0)
        h.exit("setup_pool_node2", 2)
        await h.settle()
        reason = "services[pool] setup on node2 failed (exit 2); see logs/setup_pool_node2.out"
        assert (h.store.job.exit_code, h.store.job.reason) == (1, reason)
        assert launched(h) == SETUPS  # no instance of the service ever started
        assert any(reason in e.message for e in h.events if e.object == "job")

    run(body())


def test_a_setup_past_its_timeout_is_killed_and_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=3), tmp_path, nodes=3)
        await h.settle()
        for name in SETUPS[:2]:
            h.exit(name, 0)
        await h.advance(29.9)
        assert not h.store.job.teardown_requested and h.backend.signals == []
        await h.advance(0.1)
        assert h.backend.signals[0] == ("setup_pool_node3", signal.SIGKILL)
        assert h.store.job.reason == (
            "services[pool] setup on node3 timed out after 30s and was killed; "
            "see logs/setup_pool_node3.out"
        )

    run(body())


async def grown(h: Harness, tmp_path: Path) -> None:
    """The job runs its 2-node pool; an edit grows it onto node3."""
    await h.settle()
    for name in SETUPS[:2]:
        h.exit(name, 0)
    await h.settle()
    assert str(h.store.job.phase) == "Running"
    text = textwrap.dedent(POOL.format(nodes=3))
    _, new = plan_text_source(text, "recipe.yaml", local_allocation(3), h.store.desired.nodes)
    edits.apply(h.ctx, new, diff(h.store.desired, new))
    await h.settle()


def test_a_node_the_pool_gains_runs_its_setup_before_its_instance(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=2), tmp_path, nodes=3)
        await grown(h, tmp_path)
        before = SETUPS[:2] + INSTANCES[:2]
        assert launched(h) == [*before, "setup_pool_node3"]  # its instance waits for it
        assert h.backend.launched("setup_pool_node1") == 1  # the others' never run again
        h.exit("setup_pool_node3", 0)
        await h.settle()
        assert launched(h) == [*before, "setup_pool_node3", "service_pool_node3"]
        assert not h.store.job.teardown_requested

    run(body())


def test_a_setup_that_fails_on_a_gained_node_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=2), tmp_path, nodes=3)
        await grown(h, tmp_path)
        h.exit("setup_pool_node3", 4)
        await h.settle()
        assert (h.store.job.exit_code, h.store.job.reason) == (
            1,
            "services[pool] setup on node3 failed (exit 4); see logs/setup_pool_node3.out",
        )
        assert "service_pool_node3" not in launched(h)

    run(body())


def test_a_setup_on_a_gained_node_past_its_timeout_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=2), tmp_path, nodes=3)
        await grown(h, tmp_path)
        await h.advance(30)
        assert h.backend.signals[0] == ("setup_pool_node3", signal.SIGKILL)
        assert h.store.job.reason.startswith("services[pool] setup on node3 timed out after 30s")

    run(body())


def test_restarting_the_service_does_not_run_its_setup_again(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(POOL.format(nodes=3), tmp_path, nodes=3)
        await h.settle()
        for name in SETUPS:
            h.exit(name, 0)
        await h.settle()
        answer = intents.restart(h.ctx, "pool")
        assert "setup_" not in answer
        await h.settle()
        for name in INSTANCES:
            assert h.backend.launched(name) == 2
        for name in SETUPS:
            assert h.backend.launched(name) == 1

    run(body())


REPLACE = """
name: t
services:
  - name: train
    command: [sleep, inf]
    nodes: 2
    critical: true
    replace_lost: true
    setup: "stage-shard {node}"
"""


def test_a_spare_that_replaces_a_lost_node_runs_its_setup_first(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(REPLACE, tmp_path, nodes=3)
        h.store.recipe_text = textwrap.dedent(REPLACE)
        await h.settle()
        for name in ("setup_train_node1", "setup_train_node2"):
            h.exit(name, 0)
        await h.settle()
        h.backend.lose("service_train_node1")
        await h.settle()
        assert h.store.desired.nodes.pools["train"] == ("node3", "node2")
        assert h.backend.launched("setup_train_node3") == 1
        assert h.backend.launched("service_train_node3") == 0  # waits for the spare's setup
        spec = next(s for s in h.backend.launches if s.name == "setup_train_node3")
        assert spec.argv == ("stage-shard node3",)
        h.exit("setup_train_node3", 0)
        await h.settle()
        assert h.backend.launched("service_train_node3") == 1
        assert h.backend.launched("setup_train_node2") == 1  # never again on a kept node
        assert not h.store.job.teardown_requested

    run(body())
