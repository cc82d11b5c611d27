"""A pool's leader with `start: first`: the job controller launches instance 0 alone and the
other instances only once it is ready; with `together` all launch at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.controller_harness import Harness

LEADER = """
name: lead
resources: {gpus_per_node: 0}
services:
  - name: x
    nodes: 3
    command: [worker]
    readiness: {log: {pattern: up}, interval_seconds: 1}
    leader:
      command: [scheduler]
      readiness: {tcp: {port: 8786}, interval_seconds: 1}
"""
NAMES = ["service_x_node1", "service_x_node2", "service_x_node3"]


def test_the_others_wait_for_a_ready_leader(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(LEADER, tmp_path)
        await h.settle()
        assert h.backend.launched("service_x_node1") == 1
        assert [h.backend.launched(n) for n in NAMES[1:]] == [0, 0]
        await h.advance(5)  # a leader that is not ready yet holds them
        assert [h.backend.launched(n) for n in NAMES[1:]] == [0, 0]
        h.prober.ready.add("service_x_node1")
        await h.advance(1)
        assert [h.backend.launched(n) for n in NAMES[1:]] == [1, 1]
        h.prober.ready.update(NAMES[1:])
        await h.advance(1)
        assert str(h.store.job.phase) == "Running"

    asyncio.run(body())


def test_together_launches_every_instance_at_once(tmp_path: Path) -> None:
    async def body() -> None:
        together = LEADER.replace(
            "command: [scheduler]", "command: [scheduler]\n      start: together"
        )
        h = Harness(together, tmp_path)
        await h.settle()
        assert [h.backend.launched(n) for n in NAMES] == [1, 1, 1]

    asyncio.run(body())
