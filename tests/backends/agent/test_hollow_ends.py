"""Hollow mode's simulated exits end a slice per turn of the loop: a burst of SIGTERMs (a
big job's teardown) leaves room for the process's other work, its heartbeats among it."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from srtr.backends.agent.hollow import ENDS_PER_TURN, SimulatedProcesses
from srtr.backends.base import LaunchSpec


def test_a_burst_of_sigterms_ends_every_attempt_in_order_over_several_turns(
    tmp_path: Path,
) -> None:
    count = 3 * ENDS_PER_TURN + 7
    ended: list[str] = []
    other: list[int] = []

    async def body() -> None:
        all_ended = asyncio.Event()

        def on_exit(attempt: Any, status: Any) -> None:
            ended.append(attempt.name)
            if len(ended) == count:
                all_ended.set()

        procs = SimulatedProcesses("node1", on_exit, _no_env)
        names = [f"i{k}" for k in range(count)]
        for name in names:
            procs.start(LaunchSpec(name, "node1", "127.0.0.2", ("x",), {}, tmp_path / name))
        for name in names:
            procs.signal(name, signal.SIGTERM)
        # What the loop had to do besides (a heartbeat's timer): it runs before the last end.
        asyncio.get_running_loop().call_soon(lambda: other.append(len(ended)))
        await asyncio.wait_for(all_ended.wait(), timeout=30)
        assert ended == names
        assert procs.names() == set()

    asyncio.run(body())
    assert other and other[0] < count


def _no_env(spec: Any) -> dict[str, str]:
    return {}
