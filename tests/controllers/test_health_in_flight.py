"""A pool restart with launches in flight (the agent backend's): a member whose launch is
still awaited when another fails is stopped once it starts, and relaunched with the others."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.controllers.test_launches_in_flight import held, idle, run, until, worker

GANG = """
name: t
services:
  - name: train
    command: [train]
    nodes: 3
    terminal: true
    stop_grace_seconds: 5
    restart: {policy: on-failure, scope: pool, max_restarts: 2, backoff_seconds: 2}
"""
RANKS = ["service_train_node1", "service_train_node2", "service_train_node3"]


def test_a_member_in_flight_is_stopped_and_relaunched_with_the_pool(tmp_path: Path) -> None:
    async def body() -> None:
        h = held(GANG, tmp_path, limit=4)
        task = asyncio.create_task(worker(h))
        await until(lambda: len(h.backend.asked) == 3, "every launch in flight")
        h.backend.answer(RANKS[1])
        await until(lambda: h.phase(RANKS[1]) == "Running", "rank 1 up")
        h.exit(RANKS[1], 1)  # fails while ranks 0 and 2 are still being launched
        await idle()
        assert h.store.gangs["train"].stopping  # waits for the launches in flight
        assert h.store.gangs["train"].next_start_at is None
        h.backend.answer(RANKS[0], RANKS[2])
        await until(lambda: (RANKS[2], signal.SIGTERM) in h.backend.signals, "rank 2 stopped")
        assert (RANKS[0], signal.SIGTERM) in h.backend.signals
        await until(lambda: h.store.gangs["train"].next_start_at is not None, "the backoff")
        h.clock.advance(2)
        await until(
            lambda: all(h.backend.launched(n) == 2 for n in RANKS), "the whole pool relaunched"
        )
        assert h.backend.asked[3:] == RANKS  # in pool order
        task.cancel()

    run(body)
