"""What the agent backend knows of the job's nodes (`NodeState`), of the instances their
agents run (`Live`) and of the requests that wait for an agent's answer (`Answers`); shared
by the backend and its adoption and growth."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from srtr.backends.agent import protocol as p
from srtr.backends.agent.channel import Connection
from srtr.backends.base import LaunchError, NodeInfo, NodeLostError

CONNECT_TIMEOUT = 60.0  # for the agents to dial in after they were started


@dataclass
class NodeState:
    info: NodeInfo
    conn: Connection | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # connected, lost or failed
    lost: str | None = None  # why the node is lost: nothing launches there again
    failed: str | None = None  # why its agent never came (launches there fail)
    respawns: int = 0  # new agents started here through a one-node step
    cut_off: bool = False  # lost while its agent may live on (silent, or down for SLURM)


@dataclass(frozen=True)
class Live:
    node: str
    attempt: int
    pid: int
    start: int | None = None  # the pid's kernel start time, as the agent read it


class LiveAttempts(dict[str, Live]):
    """The live attempts by instance name, indexed by node: a lost node's instances are
    found without a pass over the whole job's (a teardown loses every node in turn).
    Changed only through `[name] = live` and `del [name]`."""

    def __init__(self) -> None:
        super().__init__()
        self._by_node: dict[str, set[str]] = {}

    def __setitem__(self, name: str, live: Live) -> None:
        old = self.get(name)
        if old is not None:
            self._by_node[old.node].discard(name)
        dict.__setitem__(self, name, live)  # not super(): one per launch and per exit
        self._by_node.setdefault(live.node, set()).add(name)

    def __delitem__(self, name: str) -> None:
        live = self[name]
        dict.__delitem__(self, name)
        self._by_node[live.node].discard(name)

    def on(self, node: str) -> list[str]:
        """The names of `node`'s live attempts, in name order."""
        return sorted(self._by_node.get(node, ()))


class Presence:
    """Sets `none_left` once no node's agent is connected.

    Asked at every agent's end, and a teardown's 10,000 ends come hundreds to a loop turn
    (a pass over the nodes for each was most of the controller's share of it): one look
    per turn, which starts at the last connected node found, and then from the end (agents
    end in about the order they began)."""

    def __init__(self, nodes: dict[str, NodeState], none_left: asyncio.Event) -> None:
        self._nodes = nodes
        self._none_left = none_left
        self._hint = ""  # a node found connected by the last look
        self._due = False  # a look is due this loop turn

    def note(self) -> None:
        """An agent may have ended: look once this loop turn (now, outside a loop)."""
        if self._due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._look()
            return
        self._due = True
        loop.call_soon(self._look)

    def _look(self) -> None:
        self._due = False
        hint = self._nodes.get(self._hint)
        if hint is not None and hint.conn is not None:
            return
        for name, state in reversed(self._nodes.items()):
            if state.conn is not None:
                self._hint = name
                return
        self._none_left.set()


async def wait_connected(states: Sequence[NodeState]) -> None:
    """Wait until each of `states` is connected, lost or failed; one whose agent did not
    connect within `CONNECT_TIMEOUT` has failed."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            if len(states) == 1:  # each of a first stage's launches: no task to gather
                await states[0].ready.wait()
            else:
                await asyncio.gather(*(state.ready.wait() for state in states))
    except TimeoutError:
        for state in states:
            if state.conn is None and state.failed is None:
                state.failed = f"its agent did not connect within {CONNECT_TIMEOUT:g}s"


class Answers:
    """The requests sent to agents that wait for their answer, by sequence number.

    Their deadlines share one timer, armed at the earliest deadline still waited for: a
    stage asks 10,000 times in a few seconds, and a timer (and a timeout's context) per ask
    was a noticeable part of each launch's cost, for a deadline that is almost never met.
    """

    def __init__(self) -> None:
        self._seq = itertools.count(1)
        self._waiting: dict[int, tuple[str, asyncio.Future[p.Message]]] = {}
        self._deadlines: list[tuple[float, int]] = []  # a heap; answered ones are skipped
        self._timer: asyncio.TimerHandle | None = None

    def __bool__(self) -> bool:
        return bool(self._waiting)

    async def ask(
        self, conn: Connection, request: Callable[[int], p.Message], within: float
    ) -> p.Message:
        """Send `request(seq)` on `conn` and wait up to `within` seconds for its answer.

        Raises:
            TimeoutError: no answer in time.
            LaunchError: its agent died meanwhile (`fail`); NodeLostError: its node was lost.
        """
        seq = next(self._seq)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[p.Message] = loop.create_future()
        self._waiting[seq] = (conn.node, future)
        deadline = loop.time() + within
        heapq.heappush(self._deadlines, (deadline, seq))
        if self._timer is None or deadline < self._timer.when():
            self._arm(loop)
        conn.send(request(seq))
        try:
            return await future
        finally:
            self._waiting.pop(seq, None)
            if not self._waiting:  # nothing waits: forget the answered ones' deadlines
                self._deadlines.clear()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer at the earliest deadline of a request still waited for, if any."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        heap = self._deadlines
        while heap and heap[0][1] not in self._waiting:
            heapq.heappop(heap)
        if heap:
            self._timer = loop.call_at(heap[0][0], self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        heap, now = self._deadlines, loop.time()
        while heap and heap[0][0] <= now:
            _, seq = heapq.heappop(heap)
            held = self._waiting.get(seq)
            if held is not None and not held[1].done():
                held[1].set_exception(TimeoutError())
        self._arm(loop)

    def answer(self, seq: int, message: p.Message) -> None:
        held = self._waiting.get(seq)
        if held is not None and not held[1].done():
            held[1].set_result(message)

    def fail(
        self, node: str, why: str, *, lost: bool = False, fenced_in: float | None = None
    ) -> None:
        """Every request to `node`'s agent fails: it will not answer (`lost`: ever again;
        `fenced_in`: what it may have started stops within that many seconds)."""
        for where, future in list(self._waiting.values()):
            if where == node and not future.done():
                error = NodeLostError(why, fenced_in=fenced_in) if lost else LaunchError(why)
                future.set_exception(error)
