"""Growth: nodes a grow request brought join the running job (`add`), and leave it when
they go back to their provider (`remove`).

On SLURM a grow job's own step starts the agents of its nodes, and they dial as soon as
SLURM starts it, before srtr hears that it was granted: `admit` lets that many agents of
unknown nodes in ahead of `add`. A grown node's agent is its grow job's only step: it gets
no new one when it dies, and no instance step of the main job runs there (`grown`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from srtr.backends.agent import protocol as p
from srtr.backends.agent.roster import NodeState, wait_connected
from srtr.backends.agent.starter_base import Starter
from srtr.backends.base import NodeInfo


class Growth:
    """The nodes that joined the job after its start, and the agents let in ahead of them."""

    def __init__(
        self,
        nodes: dict[str, NodeState],
        starter: Starter,
        start_agents: Callable[[], Awaitable[None]],
        note_connections: Callable[[], None],
        grown: Sequence[str] = (),
    ) -> None:
        """`nodes` is the backend's own (nodes join and leave it here); `start_agents`
        opens the listener, `note_connections` notes that a node's agent left."""
        self._nodes = nodes
        self._starter = starter
        self._start_agents = start_agents
        self._note_connections = note_connections
        self.grown: set[str] = set(grown)
        self._admit = 0  # agents of unknown nodes still let in (`admit`)
        self._admitted: set[str] = set()  # nodes let in so, before `add` named them

    async def add(self, nodes: Sequence[NodeInfo]) -> None:
        """The starter gives each node an agent (on SLURM the grow job's own step started
        them: `admit`), and they count once their agent connected, or failed to within
        `roster.CONNECT_TIMEOUT`.

        Raises:
            ValueError: a node of that name is already one of the job's.
        """
        for node in nodes:
            state = self._nodes.get(node.name)
            if state is not None and node.name not in self._admitted:
                raise ValueError(f"node {node.name!r} is already in the allocation")
        for node in nodes:
            if node.name in self._admitted:
                self._nodes[node.name].info = node  # it dialled first; now we know its IP
            else:
                self._nodes[node.name] = NodeState(node)
        self._admitted -= {n.name for n in nodes}
        self.grown |= {n.name for n in nodes}
        await self._start_agents()
        await self._starter.add(list(nodes))
        await wait_connected([self._nodes[n.name] for n in nodes])

    def admit(self, count: int) -> None:
        """Let up to `count` agents of nodes the job does not know yet join: the agents of a
        grow job, which dial as soon as SLURM starts it, before srtr hears it was granted."""
        self._admit = count

    def let_in(self, node: str) -> bool:
        """Whether the agent of unknown `node` is let in (`admit`): its node then is one of
        the job's, whose address `add` fills in."""
        if self._admit <= 0:
            return False
        self._admit -= 1
        self._admitted.add(node)
        self._nodes[node] = NodeState(NodeInfo(node, ""))
        return True

    async def remove(self, names: Sequence[str]) -> None:
        """Their agents are told to end (nothing runs there: the grower checked), and their
        end is no node loss."""
        gone = [self._nodes.pop(name) for name in names if name in self._nodes]
        for state in gone:
            if state.conn is not None:
                state.conn.send(p.Shutdown("the node goes back to its provider"))
        await self._starter.remove(list(names))
        self._note_connections()
