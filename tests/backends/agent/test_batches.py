"""What one turn of the loop sends or reports goes together: a connection's messages leave
as one write, and a run of observations reaches the listener in one callback, yet no exit
overtakes the start that an answer read before it resumes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from srtr.backends.agent import protocol as p
from srtr.backends.agent.backend import AgentBackend
from srtr.backends.agent.channel import Connection
from srtr.backends.agent.roster import Live
from srtr.backends.agent.starters import LocalAgents
from srtr.backends.base import NodeInfo


class Written:
    """A transport that keeps what was written, one entry per write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def test_a_turns_messages_leave_as_one_write_in_their_order() -> None:
    async def body() -> list[bytes]:
        transport = Written()
        conn = Connection("node1", 1, transport)
        conn.send(p.Signal("a", 15))
        conn.send(p.Signal("b", 15))
        assert transport.writes == []  # at the end of this turn, not now
        await asyncio.sleep(0)
        conn.send(p.Shutdown("done"))
        conn.close()  # a close writes what is queued first
        return transport.writes

    writes = asyncio.run(body())
    assert writes == [
        p.encode(p.Signal("a", 15)) + p.encode(p.Signal("b", 15)),
        p.encode(p.Shutdown("done")),
    ]


def test_observations_come_together_and_after_the_launch_an_answer_woke(tmp_path: Path) -> None:
    seen: list[str] = []

    async def body() -> None:
        node = NodeInfo("node1", "127.0.0.1")
        backend = AgentBackend([node], LocalAgents([node], tmp_path))
        backend.set_listener(lambda obs: seen.append(f"exit {obs.name}"))
        conn = Connection("node1", 1, Written())
        for name in ("a", "b"):
            backend._live[name] = Live("node1", 1, 10)

        async def launch() -> None:
            await backend._answers.ask(conn, lambda seq: p.Signal("c", 0), 5.0)
            seen.append("launched c")

        task = asyncio.create_task(launch())
        await asyncio.sleep(0)
        # One batch read off the connection: an exit, the answer to c's launch, two exits.
        backend.received(conn, p.Exited("a", 1, 10, 0, None, "exited"))
        backend.received(conn, p.Launched(1, "c", 1, 11, None))
        backend.received(conn, p.Exited("b", 1, 10, 0, None, "exited"))
        backend.received(conn, p.Exited("c", 1, 11, 0, None, "exited"))
        await task
        await asyncio.sleep(0)

    asyncio.run(body())
    assert seen == ["exit a", "launched c", "exit b", "exit c"]
