"""A big job's whole-job reconciles are paced: one instance's change wakes the job after a
moment that grows with the job; a small job's wakes are immediate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from srtr.controllers.context import Ctx
from srtr.controllers.pace import MAX_PACE, PACED_FROM, pace, wake_first
from tests.support.controller_harness import Harness

RECIPE = """
name: paced
services:
  - name: web
    command: [sleep, infinity]
    nodes: {nodes}
    critical: true
"""


def test_the_pace_grows_with_the_job_and_is_bounded() -> None:
    assert pace(PACED_FROM - 1) == 0.0
    assert 0.0 < pace(PACED_FROM) < pace(80_000) <= MAX_PACE
    assert pace(10**7) == MAX_PACE


def _failed_after_exit(tmp_path: Path, nodes: int) -> tuple[bool, bool]:
    """(teardown requested once the exit settled, ... once the pace passed)."""

    async def body() -> tuple[bool, bool]:
        h = Harness(RECIPE.format(nodes=nodes), tmp_path)
        await h.advance(MAX_PACE)
        assert h.phase("service_web_node1") == "Running"
        h.exit("service_web_node1", 1)
        await h.settle()
        at_once = h.store.job.teardown_requested
        await h.advance(pace(nodes))
        return at_once, h.store.job.teardown_requested

    return asyncio.run(body())


def test_a_small_jobs_critical_exit_ends_it_at_once(tmp_path: Path) -> None:
    assert _failed_after_exit(tmp_path, 3) == (True, True)


def test_a_big_jobs_critical_exit_ends_it_after_the_pace(tmp_path: Path) -> None:
    assert _failed_after_exit(tmp_path, PACED_FROM) == (False, True)


class _Queue:
    def __init__(self) -> None:
        self.added: list[tuple[str, float]] = []

    def add(self, key: str) -> None:
        self.added.append((key, 0.0))

    def add_after(self, key: str, seconds: float) -> None:
        self.added.append((key, seconds))


def test_wake_first_queues_at_once_then_no_more_than_the_pace_allows() -> None:
    """A stage's last launch answer wakes the job at once (the next stage opens without the
    pace's wait); another within the pace waits for it, as `wake` does."""
    now = [100.0]
    queue = _Queue()
    ctx = cast(
        Ctx,
        SimpleNamespace(
            store=SimpleNamespace(specs=dict.fromkeys(range(80_000))),
            clock=SimpleNamespace(now=lambda: now[0]),
            queue=queue,
            woken_at={},
        ),
    )
    wait = pace(80_000)
    wake_first(ctx, "job")
    now[0] += wait / 2
    wake_first(ctx, "job")
    now[0] += wait
    wake_first(ctx, "job")
    assert queue.added == [("job", 0.0), ("job", wait), ("job", 0.0)]
