"""The controller's side of relays: which agents relay for which, and whose sockets the
silence watcher may stop hearing one by one.

At 10,000 agents the watcher's epoll reports 10,000 heartbeats a second, ~2.5 µs of the
controller's CPU each all in (docs/agents.md, "The silence watcher at 10,000 agents"). A job
of at least `RELAYED_FROM` nodes is cut, in the allocation's order, into groups of about
ceil(sqrt(n)) nodes (SLURM's TreeWidth, Flux's TBON); the first connected agent of a group
is its relay (`p.Relay`): it binds a UDP port and says which (`p.Relaying`). Every other
connected agent of the group (a member) is told where its relay is (`p.RelayTo`: the relay's
address as its own connection comes from, that port, the group's key), and sends it a tagged
datagram a second while its own lease holds (`relay`). Once a second the relay sends one
record for the group (`p.Relayed`: the members it did not hear lately).

What changes is only how the controller learns that a member is alive, never how it decides
that one is not: a member the relay reported heard leaves the beats epoll (`Switch.park`); it
comes back (`Switch.unpark`), heard as of its own socket's newest bytes (the kernel's
`tcpi_last_data_recv`), as soon as a record misses it, its relay's record is late (`LATE`),
its relay's connection ends, or a round's read finds its socket quiet (`Switch.quiet`: a relay
that vouches wrongly is found within a round). A node is lost only by its own socket's
silence; a relay frozen or dead costs its members a switch back to direct watching, never a
NodeLost. Every agent's agent-to-controller connection, heartbeats, lease and fence are
unchanged, relayed or not: the controller's kernel still acknowledges every heartbeat.
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from srtr.backends.agent import protocol as p
from srtr.backends.agent.beats import BeatSockets, newest_arrival

log = logging.getLogger("srtr")

RELAYED_FROM = 16  # nodes: the agents of a smaller job are all watched directly
# Heartbeat periods since a relay's last record after which it no longer speaks for its
# members: a record comes when it changes, and at least every `relay.KEEPALIVE` (8) periods.
LATE = 10.0
KEY = 16  # bytes of a group's key

A = TypeVar("A")
A_contra = TypeVar("A_contra", contravariant=True)


def width(n: int) -> int:
    """The group size for `n` nodes: ceil(sqrt(n)), at least 2."""
    root = 1
    while root * root < n:
        root += 1
    return max(2, root)


def groups(nodes: Sequence[str], least: int = RELAYED_FROM) -> list[list[str]]:
    """`nodes` (the allocation's order) cut into relay groups; none for fewer than `least`.
    A group of one node has no one to relay for: its node stays watched directly."""
    if len(nodes) < least:
        return []
    w = width(len(nodes))
    cut = [list(nodes[i : i + w]) for i in range(0, len(nodes), w)]
    return [group for group in cut if len(group) > 1]


class Switch(Protocol[A_contra]):
    """How relays act on the agents' connections (`channel`; a fake in tests)."""

    def send(self, agent: A_contra, message: p.Message) -> None: ...

    def host(self, agent: A_contra) -> str | None:
        """The address `agent`'s connection comes from (as its group's members reach it)."""
        ...

    def listen(self, agent: A_contra) -> None:
        """Read `agent`'s socket (a relay's) at every look that sees bytes arrive on it: its
        records come without a doorbell, so that they never wake the loop."""
        ...

    def park(self, agent: A_contra) -> bool:
        """Stop hearing `agent`'s socket one by one (its relay vouches); whether it did."""
        ...

    def unpark(self, agent: A_contra, *, read: bool = True) -> None:
        """Hear it directly again, as of its own socket's newest bytes; `read`: read it too
        (edge-triggered, bytes already there would read as just come at the next look)."""
        ...


@dataclass(eq=False)
class _Group(Generic[A]):
    nodes: list[str]
    key: bytes = b""
    agents: dict[int, A] = field(default_factory=dict)  # index -> its connected agent
    relay: int | None = None  # the index of the agent asked to relay
    port: int = 0  # its UDP port, once it answered
    host: str = ""
    told: set[int] = field(default_factory=set)  # members told where the relay is
    parked: set[int] = field(default_factory=set)  # members heard through the relay
    record_at: float = 0.0  # when its relay's last record (or answer) came
    refused: set[int] = field(default_factory=set)  # could not relay: never asked again
    said: bool = False  # its first parking was logged


class Relays(Generic[A]):
    """The relay groups of a job's allocation, and the switch of each member's socket."""

    def __init__(
        self,
        nodes: Sequence[str],
        switch: Switch[A],
        heartbeat: float,
        *,
        least: int = RELAYED_FROM,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._switch = switch
        self._late = LATE * heartbeat
        self._clock = clock
        self._groups: list[_Group[A]] = [_Group(g) for g in groups(nodes, least)]
        self._where = {n: (g, i) for g in self._groups for i, n in enumerate(g.nodes)}
        self._of: dict[A, tuple[_Group[A], int]] = {}
        self._ending = False  # the job ends: no new relays, no word to the members

    @property
    def parked(self) -> int:
        """How many members are heard through their relays now."""
        return sum(len(g.parked) for g in self._groups)

    @property
    def relaying(self) -> int:
        """How many relays answered and speak for their groups."""
        return sum(1 for g in self._groups if g.port)

    def joined(self, node: str, agent: A) -> None:
        """`node`'s agent connected (and is watched directly)."""
        where = self._where.get(node)
        if where is None:
            return
        group, index = where
        group.agents[index] = agent
        self._of[agent] = where
        if group.relay is None:
            self._elect(group)
        elif group.port:
            self._tell(group, index)

    def left(self, agent: A) -> None:
        """`agent`'s connection ended (or it is lost): if it was a relay, its members are
        heard directly again and the group's next connected agent is asked to relay."""
        where = self._of.pop(agent, None)
        if where is None:
            return
        group, index = where
        if group.agents.get(index) is agent:
            del group.agents[index]
        group.told.discard(index)
        group.parked.discard(index)
        if group.relay == index:
            self._fall_back(group, f"its relay's connection ended ({group.nodes[index]})")
            self._elect(group)

    def received(self, agent: A, message: p.Message) -> None:
        """A relay's `Relaying` answer or `Relayed` record."""
        where = self._of.get(agent)
        if where is None or where[0].relay != where[1]:
            return  # not (or no longer) a relay: a record that crossed its end
        group, index = where
        if isinstance(message, p.Relaying):
            self._answered(group, index, agent, message)
        elif isinstance(message, p.Relayed) and group.port:
            group.record_at = self._clock()
            self._record(group, message.missing)

    def check(self, now: float, starved: Iterable[A] = ()) -> None:
        """The watcher's look: a relay whose record is late no longer speaks for its members;
        a member among `starved` (its socket's read in this look's round found nothing since
        the look before) is heard directly again, whatever its relay says: a relay that
        vouches for a silent node is found within two rounds."""
        for group in self._groups:
            if group.parked and now - group.record_at > self._late:
                relay = "?" if group.relay is None else group.nodes[group.relay]
                log.info(
                    "agents: the relay on %s sent no record for %.1fs: %d node(s) watched "
                    "directly again",
                    relay,
                    now - group.record_at,
                    len(group.parked),
                )
                self._unpark(group, set(group.parked))
        for agent in starved:
            where = self._of.get(agent)
            if where is not None and where[1] in where[0].parked:
                self._unpark(where[0], {where[1]})

    def end(self) -> None:
        """The job ends: a relay that leaves is not replaced (its members, told to shut down,
        are only heard directly again)."""
        self._ending = True

    def stalled(self, now: float) -> None:
        """The watcher was not running: the relays' records may be waiting unread."""
        for group in self._groups:
            group.record_at = max(group.record_at, now)

    def _elect(self, group: _Group[A]) -> None:
        """Ask the group's first connected agent that did not refuse to relay for it."""
        group.relay, group.port = None, 0
        if self._ending:
            return
        index = min((i for i in group.agents if i not in group.refused), default=None)
        if index is None:
            return
        group.relay, group.key, group.said = index, secrets.token_bytes(KEY), False
        self._switch.send(group.agents[index], p.Relay(group.key.hex(), len(group.nodes), index))

    def _answered(self, group: _Group[A], index: int, agent: A, answer: p.Relaying) -> None:
        host = self._switch.host(agent)
        if answer.port <= 0 or not host:
            log.warning(
                "agents: %s cannot relay for its group: %s; its group is watched directly",
                group.nodes[index],
                answer.error or "no address",
            )
            group.refused.add(index)
            self._elect(group)
            return
        group.port, group.host, group.record_at = answer.port, host, self._clock()
        self._switch.listen(agent)
        for member in group.agents:
            self._tell(group, member)

    def _tell(self, group: _Group[A], index: int) -> None:
        if index == group.relay:
            return
        group.told.add(index)
        message = p.RelayTo(group.host, group.port, group.key.hex(), index)
        self._switch.send(group.agents[index], message)

    def _record(self, group: _Group[A], missing: list[int]) -> None:
        gone = group.parked.intersection(missing)
        if gone:
            self._unpark(group, gone)
        heard = group.told.difference(missing, group.parked)
        for index in heard:
            if self._switch.park(group.agents[index]):
                group.parked.add(index)
        if heard and not group.said and group.relay is not None:
            group.said = True
            log.info(
                "agents: the relay on %s speaks for %d of its group's %d nodes (their "
                "sockets left the watcher's epoll)",
                group.nodes[group.relay],
                len(group.parked),
                len(group.nodes),
            )

    def _unpark(self, group: _Group[A], indexes: set[int]) -> None:
        for index in indexes:
            group.parked.discard(index)
            agent = group.agents.get(index)
            if agent is not None:  # at the job's end: no read (its goodbye comes anyway)
                self._switch.unpark(agent, read=not self._ending)

    def _fall_back(self, group: _Group[A], why: str) -> None:
        """The group's members are heard directly again and stop sending to its relay."""
        if group.parked:
            log.info("agents: %s: %d node(s) watched directly again", why, len(group.parked))
        self._unpark(group, set(group.parked))
        for index in group.told:
            agent = group.agents.get(index)
            if agent is not None and not self._ending:
                self._switch.send(agent, p.RelayTo("", 0))
        group.told.clear()
        group.relay, group.port = None, 0


class Agent(Protocol):
    """What `SocketSwitch` needs of an agent's connection (`channel._AgentProtocol`)."""

    @property
    def fd(self) -> int: ...

    @property
    def sock(self) -> socket.socket | None: ...

    def send(self, message: p.Message) -> None: ...


class SocketSwitch:
    """The switch on the controller's sockets: `beats` parks and unparks them; `read` reads
    one (the watcher's read: its bytes taken, heard as of when they came)."""

    def __init__(self, beats: BeatSockets[Any], read: Callable[[Iterable[int]], None]) -> None:
        self._beats = beats
        self._read = read

    def send(self, agent: Agent, message: p.Message) -> None:
        agent.send(message)

    def host(self, agent: Agent) -> str | None:
        try:
            return None if agent.sock is None else str(agent.sock.getpeername()[0])
        except OSError:
            return None

    def listen(self, agent: Agent) -> None:
        if agent.fd >= 0:
            self._beats.read_always(agent.fd)

    def park(self, agent: Agent) -> bool:
        return agent.fd >= 0 and self._beats.park(agent.fd)

    def unpark(self, agent: Agent, *, read: bool = True) -> None:
        fd = agent.fd
        if fd >= 0 and self._beats.unpark(fd, newest_arrival(agent.sock)) and read:
            self._read((fd,))
