"""Hollow mode's simulated exits end a slice per turn of the loop: a burst of SIGTERMs (a
big job's teardown) leaves room for the process's other work, its heartbeats among it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srtr.backends.agent.hollow import ENDS_PER_TURN, SimulatedProcesses
from srtr.backends.base import LaunchSpec
from tests.backends.agent.test_lease_ticker import _Server, _stop, _Wire


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


def test_heartbeats_keep_going_through_a_burst_of_80000_simulated_exits(tmp_path: Path) -> None:
    # A 10,000 x 8 teardown: every attempt SIGTERMed at once. The agents' heartbeats (one
    # shared timer, `lease._Ticker`) go between the burst's slices, not after all of it.
    count, period = 80_000, 0.02
    ended = 0
    during: list[int] = []  # how many attempts had ended at each heartbeat

    async def body() -> None:
        nonlocal ended
        server = _Server(4)
        leases = await server.agents(length=30.0)
        for lease in leases:
            assert lease.beats is not None
            lease.wire = _Noting(lease.beats, lambda: during.append(ended))  # type: ignore[assignment]
        all_ended = asyncio.Event()

        def on_exit(attempt: Any, status: Any) -> None:
            nonlocal ended
            ended += 1
            if ended == count:
                all_ended.set()

        procs = SimulatedProcesses("node1", on_exit, _no_env)
        for k in range(count):
            procs.start(LaunchSpec(f"i{k}", "node1", "127.0.0.2", ("x",), {}, tmp_path / "log"))
        tasks = [asyncio.create_task(lease.beat(period)) for lease in leases]
        await server.until(2)
        for k in range(count):
            procs.signal(f"i{k}", signal.SIGTERM)
        await asyncio.wait_for(all_ended.wait(), timeout=60)
        await _stop(tasks, leases)

    asyncio.run(body())
    assert any(0 < n < count for n in during), during


class _Noting(_Wire):
    def __init__(self, writer: asyncio.StreamWriter, note: Callable[[], None]) -> None:
        super().__init__(writer)
        self._note = note

    def beat(self) -> None:
        self._note()
        super().beat()
