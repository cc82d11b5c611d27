"""The agents' leases of one process beat on one shared timer (`lease._Ticker`): a hollow
process's thousands of agents cost one wake-up a heartbeat period, not a task step each,
and every lease still beats on its own connection and fences on its own silence.

Real loopback sockets on a real event loop; no clock is faked."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from typing import Any

from srtr.backends.agent.lease import Lease
from tests.support.e2e_util import wait_for_async as wait_for

PERIOD = 0.2


class _Attempt:
    name = "web-0"
    attempt = 0


class _Instances:
    """One live instance; the signals the lease sends it."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def signal(self, name: str, signum: int) -> None:
        self.signals.append(signum)

    def get(self, name: str) -> _Attempt | None:
        return _Attempt()

    def attempts(self) -> Sequence[_Attempt]:
        return [_Attempt()]


class _Wire:
    """A heartbeat is one byte on the agent's own connection."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def beat(self) -> None:
        self._writer.write(b".")


class _CountingLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self.timers = 0

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        self.timers += 1
        return super().call_at(when, callback, *args, **kw)


class _Server:
    """Counts the heartbeats each agent's connection brings, and wakes whoever waits for
    every connection to have brought so many (no polling: that would set timers too)."""

    def __init__(self, count: int) -> None:
        self.heard = [0] * count
        self._goal = 0
        self._reached = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = int((await reader.readexactly(4)).decode())
        self.heard[me] = 0  # joined
        self._check()
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(4096):
                self.heard[me] += len(data)
                self._check()

    def _check(self) -> None:
        if min(self.heard) >= self._goal:
            self._reached.set()

    async def until(self, goal: int, among: range | None = None) -> None:
        """Until every connection (of `among`) brought `goal` heartbeats."""
        among = among or range(len(self.heard))
        while min(self.heard[k] for k in among) < goal:
            self._goal, self._reached = goal, asyncio.Event()
            if among != range(len(self.heard)):  # the others' progress wakes us too
                self._goal = 0
            await asyncio.wait_for(self._reached.wait(), timeout=10)

    async def agents(self, length: float) -> list[Lease]:
        """A lease of `length` for each connection, beats on it to come."""
        self.heard = [-1] * len(self.heard)
        self._server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        leases = []
        for k in range(len(self.heard)):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"{k:04d}".encode())
            lease = Lease(f"node{k}", _Instances(), window=0.0)
            lease.beats, lease.wire = writer, _Wire(writer)  # type: ignore[assignment]
            lease.granted(length, asyncio.get_running_loop().time())
            leases.append(lease)
        await self.until(0)
        return leases


async def _stop(tasks: list[asyncio.Task[str]], leases: list[Lease]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for lease in leases:
        if lease.beats is not None:
            lease.beats.close()


def test_many_leases_beat_on_one_timer_each_on_its_own_connection() -> None:
    count = 40

    async def body() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, _CountingLoop)
        server = _Server(count)
        leases = await server.agents(length=30.0)
        tasks = [asyncio.create_task(lease.beat(PERIOD)) for lease in leases]
        await server.until(1)  # each one's first heartbeat
        timers = loop.timers
        await server.until(6)  # five periods more, each one's heartbeats on its connection
        # One task per lease would have set at least one timer per lease and period.
        assert loop.timers - timers < count
        assert all(lease.fenced is None for lease in leases)
        await _stop(tasks, leases)

    with asyncio.Runner(loop_factory=_CountingLoop) as runner:
        runner.run(body())


def test_each_lease_fences_on_its_own_when_its_beats_stop_being_acknowledged() -> None:
    count, length = 20, 3 * PERIOD

    async def body() -> None:
        server = _Server(count)
        leases = await server.agents(length=length)
        tasks = [asyncio.create_task(lease.beat(PERIOD)) for lease in leases]
        await server.until(2)
        cut = leases[::2]
        for lease in cut:  # its connection ends: nothing it sends is acknowledged now
            assert lease.beats is not None
            lease.beats.transport.abort()
        await wait_for(lambda: all(lease.fenced is not None for lease in cut))
        # The others kept their leases, renewed by acknowledged heartbeats, past the point
        # where a lease not renewed since the cut would have run out.
        live = range(1, count, 2)
        await server.until(max(server.heard[k] for k in live) + 4, among=live)
        for k, lease in enumerate(leases):
            instances = lease._groups
            assert isinstance(instances, _Instances)
            if k % 2 == 0:
                assert lease.fenced is not None and instances.signals[:1] == [signal.SIGTERM]
            else:
                assert lease.fenced is None and instances.signals == []
        await _stop(tasks, leases)

    asyncio.run(body())


class _Broken(_Wire):
    def beat(self) -> None:
        raise RuntimeError("a bug in one agent's heartbeat")


def test_an_error_in_one_leases_heartbeat_ends_its_session_not_the_others_heartbeats() -> None:
    count = 6

    async def body() -> None:
        server = _Server(count)
        leases = await server.agents(length=30.0)
        tasks = [asyncio.create_task(lease.beat(PERIOD)) for lease in leases]
        await server.until(1)
        assert leases[2].beats is not None
        leases[2].wire = _Broken(leases[2].beats)  # type: ignore[assignment]
        done, _ = await asyncio.wait([tasks[2]], timeout=10)
        assert done and isinstance(tasks[2].exception(), RuntimeError)
        others = range(3, count)  # those after it in the timer's turn
        await server.until(max(server.heard[k] for k in others) + 3, among=others)
        await _stop(tasks, leases)

    asyncio.run(body())


def test_a_tick_steps_its_leases_in_slices_and_the_loop_runs_between_them(
    monkeypatch: Any,
) -> None:
    """A hollow process's 10,000 steps must not hold its other callbacks (launch answers)
    back for the whole tick: what was queued meanwhile runs between two slices."""
    from srtr.backends.agent import lease as lease_module

    monkeypatch.setattr(lease_module, "STEPS_PER_TURN", 2)
    order: list[str] = []

    class _Stepped:
        def __init__(self, name: str) -> None:
            self.name = name

        def step(self, beat: bool) -> None:
            order.append(self.name)
            if self.name == "a":
                asyncio.get_running_loop().call_soon(order.append, "other")

    async def main() -> None:
        ticker = lease_module._Ticker(asyncio.get_running_loop(), 60.0)
        leases: Any = [_Stepped(n) for n in "abcde"]
        ticker.leases = dict.fromkeys(leases)
        ticker._step(list(leases), 0)
        for _ in range(5):  # a turn of the loop each: more than the three slices need
            await asyncio.sleep(0)

    asyncio.run(main())
    assert order == ["a", "b", "other", "c", "d", "e"]
