"""`roster.Presence`: whether any agent is still connected, looked at once per loop turn."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from srtr.backends.agent.roster import NodeState, Presence
from srtr.backends.base import NodeInfo


class CountingNodes(dict[str, NodeState]):
    """The nodes, counting the looks that walk them."""

    walks = 0

    def items(self) -> Any:
        CountingNodes.walks += 1
        return super().items()


def test_a_turns_ends_are_one_look_and_the_last_end_is_seen() -> None:
    async def body() -> None:
        nodes = CountingNodes({f"n{k}": NodeState(NodeInfo(f"n{k}", "")) for k in range(100)})
        for state in nodes.values():
            state.conn = cast(Any, object())
        none_left = asyncio.Event()
        presence = Presence(nodes, none_left)
        for state in list(nodes.values())[::-1]:  # the worst order for a look from the end
            state.conn = None
            presence.note()
        assert not none_left.is_set()  # looked at the end of the turn
        await asyncio.sleep(0)
        assert none_left.is_set() and CountingNodes.walks == 1

    asyncio.run(body())


def test_a_connected_agent_keeps_it_clear() -> None:
    async def body() -> None:
        nodes = {k: NodeState(NodeInfo(k, "")) for k in ("a", "b")}
        nodes["a"].conn = cast(Any, object())
        none_left = asyncio.Event()
        presence = Presence(nodes, none_left)
        presence.note()
        await asyncio.sleep(0)
        assert not none_left.is_set()
        nodes["a"].conn = None
        presence.note()
        await asyncio.sleep(0)
        assert none_left.is_set()

    asyncio.run(body())
