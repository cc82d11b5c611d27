"""Relays on the controller's side (`relayed.Relays`): the groups, who relays, and the switch
of each member's socket between its relay's word and direct watching. A fake switch and a
fake clock; the agents are names."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from srtr.backends.agent import protocol as p
from srtr.backends.agent.relayed import LATE, RELAYED_FROM, Relays, groups, width


@dataclass
class FakeSwitch:
    sent: list[tuple[str, p.Message]] = field(default_factory=list)
    parked: set[str] = field(default_factory=set)
    unparked: list[str] = field(default_factory=list)
    read: list[bool] = field(default_factory=list)  # whether each unpark read the socket

    def send(self, agent: str, message: p.Message) -> None:
        self.sent.append((agent, message))

    def host(self, agent: str) -> str | None:
        return f"10.0.0.{agent.removeprefix('n')}"

    def listen(self, agent: str) -> None:
        pass

    def park(self, agent: str) -> bool:
        self.parked.add(agent)
        return True

    def unpark(self, agent: str, *, read: bool = True) -> None:
        self.parked.discard(agent)
        self.unparked.append(agent)
        self.read.append(read)

    def to(self, agent: str) -> list[p.Message]:
        return [m for a, m in self.sent if a == agent]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def nodes(n: int) -> list[str]:
    """Interned: an agent is known by identity, as the channel's connections are."""
    return [sys.intern(f"n{k}") for k in range(n)]


def test_groups_are_about_the_square_root_in_the_allocations_order() -> None:
    assert width(10_000) == 100 and width(16) == 4 and width(17) == 5 and width(2) == 2
    cut = groups(nodes(10_000))
    assert len(cut) == 100 and all(len(g) == 100 for g in cut)
    assert cut[0][:3] == ["n0", "n1", "n2"] and cut[1][0] == "n100"
    assert groups(nodes(RELAYED_FROM - 1)) == []  # a small job: all watched directly
    # 17 nodes: groups of 5, and the last (2 nodes) still has one member to relay for.
    assert [len(g) for g in groups(nodes(17))] == [5, 5, 5, 2]
    assert [len(g) for g in groups(nodes(21))] == [5, 5, 5, 5]  # n20 alone: direct


def joined(count: int, clock: Clock | None = None) -> tuple[Relays[str], FakeSwitch]:
    switch = FakeSwitch()
    relays: Relays[str] = Relays(nodes(count), switch, 1.0, clock=clock or Clock())
    for node in nodes(count):
        relays.joined(node, node)
    return relays, switch


def answer(relays: Relays[str], relay: str, port: int = 4000) -> None:
    relays.received(relay, p.Relaying(port))


def test_the_first_connected_agent_relays_and_the_others_are_told_where_after_it_answers() -> None:
    switch = FakeSwitch()
    relays: Relays[str] = Relays(nodes(16), switch, 1.0, clock=Clock())
    relays.joined("n2", "n2")  # the first of group 0 to connect
    relays.joined("n0", "n0")
    (ask,) = switch.to("n2")
    assert isinstance(ask, p.Relay) and ask.count == 4 and ask.index == 2
    assert switch.to("n0") == []  # nothing to tell before the relay has a port
    answer(relays, "n2")
    (told,) = switch.to("n0")
    assert told == p.RelayTo("10.0.0.2", 4000, ask.key, 0)
    relays.joined("n1", "n1")  # a member that connects later is told at once
    assert switch.to("n1") == [p.RelayTo("10.0.0.2", 4000, ask.key, 1)]
    assert relays.relaying == 1


def test_members_leave_the_epoll_only_once_their_relay_reported_them_heard() -> None:
    relays, switch = joined(16)
    answer(relays, "n0")
    assert switch.parked == set()
    relays.received("n0", p.Relayed(missing=[2, 3]))
    assert switch.parked == {"n1"} and relays.parked == 1
    relays.received("n0", p.Relayed(missing=[]))
    assert switch.parked == {"n1", "n2", "n3"}
    relays.received("n1", p.Relayed(missing=[]))  # not a relay: ignored
    relays.received("n0", p.Relayed(missing=[3]))  # n3 missed: watched directly at once
    assert switch.parked == {"n1", "n2"} and switch.unparked == ["n3"]


def test_a_late_record_or_an_ended_relay_puts_its_members_back_and_another_relays() -> None:
    clock = Clock()
    relays, switch = joined(16, clock)
    answer(relays, "n0")
    answer(relays, "n4")
    relays.received("n0", p.Relayed())
    relays.received("n4", p.Relayed())
    assert switch.parked == {"n1", "n2", "n3", "n5", "n6", "n7"}
    clock.now += LATE - 0.5
    relays.received("n4", p.Relayed())  # group 1's relay is on time
    clock.now += 1.0
    relays.check(clock.now)
    assert switch.parked == {"n5", "n6", "n7"}  # group 0's record is late: its members back
    relays.received("n0", p.Relayed())  # it speaks again: they leave the epoll again
    assert switch.parked == {"n1", "n2", "n3", "n5", "n6", "n7"}
    switch.sent.clear()
    relays.left("n4")  # group 1's relay ended (or was lost): its members, never lost, back
    assert switch.parked == {"n1", "n2", "n3"}
    stop, ask = switch.to("n5")  # the next connected agent of the group relays
    assert stop == p.RelayTo("", 0) and isinstance(ask, p.Relay) and ask.index == 1
    assert switch.to("n6") == [p.RelayTo("", 0)]  # stop sending to the old one
    answer(relays, "n5", 4001)
    assert switch.to("n6")[-1] == p.RelayTo("10.0.0.5", 4001, ask.key, 2)


def test_a_starved_member_is_watched_directly_whatever_its_relay_says() -> None:
    relays, switch = joined(16)
    answer(relays, "n0")
    relays.received("n0", p.Relayed())
    relays.check(100.0, starved=["n2", "n5"])  # n5 is not parked: nothing to do
    assert switch.unparked == ["n2"]


def test_an_agent_that_cannot_relay_leaves_it_to_the_next_and_the_end_elects_no_one() -> None:
    relays, switch = joined(16)
    relays.received("n0", p.Relaying(0, "no address"))
    (ask,) = switch.to("n1")
    assert isinstance(ask, p.Relay)
    answer(relays, "n1")
    relays.received("n1", p.Relayed())
    assert switch.parked == {"n0", "n2", "n3"}
    relays.end()
    switch.sent.clear()
    relays.left("n1")
    assert switch.parked == set() and switch.sent == []  # at the end: no word, no new relay
    assert switch.read[-3:] == [False] * 3  # nor a read of each member (a teardown's time)


def test_a_stalled_watcher_does_not_count_its_stall_as_late_records() -> None:
    clock = Clock()
    relays, switch = joined(16, clock)
    answer(relays, "n0")
    relays.received("n0", p.Relayed())
    clock.now += 2 * LATE
    relays.stalled(clock.now)
    relays.check(clock.now)
    assert switch.parked == {"n1", "n2", "n3"}
