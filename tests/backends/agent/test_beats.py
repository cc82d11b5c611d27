"""The silence watcher's view of the agents' sockets (`beats.BeatSockets`): who was heard
when, who is silent, which sockets a look reads.

Real sockets (socketpairs); the cut-offs are the looks' own times, no clock is faked."""

from __future__ import annotations

import contextlib
import os
import select
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from srtr.backends.agent.beats import BeatSockets


@contextmanager
def watched(
    n: int, rounds: int = 1, parked_laps: int = 1
) -> Iterator[tuple[BeatSockets[int], list[socket.socket]]]:
    """`n` sockets watched for owners 0..n-1, and their peers (what an agent writes on)."""
    made = [socket.socketpair() for _ in range(n)]
    beats: BeatSockets[int] = BeatSockets(rounds, parked_laps)
    for k, (ours, _) in enumerate(made):
        ours.setblocking(False)
        beats.add(ours.fileno(), k)
    try:
        yield beats, [theirs for _, theirs in made]
    finally:
        beats.close()
        for a, b in made:
            a.close()
            b.close()


def test_the_silent_sockets_among_many_are_found_and_no_live_one() -> None:
    with watched(40) as (beats, peers):
        quiet = {3, 17, 29}
        for k, peer in enumerate(peers):
            if k not in quiet:
                peer.send(b"\0" * 9)
        now, _ = beats.look()
        # Heard at the look: silent only from a cut-off after it; the others since admission.
        assert sorted(beats.silent(now)) == sorted(quiet)
        assert sorted(beats.silent(now + 1e-3)) == list(range(40))
        peers[17].send(b"\0" * 9)
        later, _ = beats.look()
        # Its newest look counts, not its admission: heard at `later`, 17 is no longer silent
        # from a cut-off before it, and is the only one not silent from `later` on.
        assert sorted(beats.silent(now)) == [3, 29]
        assert sorted(beats.silent(later)) == sorted(set(range(40)) - {17})


def test_a_socket_is_heard_at_the_look_that_saw_its_bytes() -> None:
    with watched(2) as (beats, peers):
        admitted = beats.heard_at(_fd(beats, 0))
        assert admitted is not None
        peers[0].send(b"\0" * 9)
        now, _ = beats.look()
        assert beats.heard_at(_fd(beats, 0)) == now
        assert beats.heard_at(_fd(beats, 1)) == admitted
        # Old looks forgotten: the silent one's time is kept until it is removed.
        beats.forget(now)
        assert beats.heard_at(_fd(beats, 0)) == now


def test_a_socket_read_before_the_look_is_heard_at_its_read() -> None:
    """Edge-triggered, a look reports only the sockets that still hold bytes: a heartbeat
    the batch reader took with a message (on its doorbell) before the look is not reported.
    The read itself counts (`heard`), or an agent whose every heartbeat came with a message
    would be silent."""
    with watched(2) as (beats, peers):
        fd = _fd(beats, 0)
        peers[0].send(b"\0" * 9)
        os.read(fd, 64)  # another reader takes the bytes before the watcher looks
        before, _ = beats.look()
        assert 0 in beats.silent(before + 1e-3)  # the look did not see them
        beats.heard(fd)
        heard = beats.heard_at(fd)
        assert heard is not None and heard > before
        later, _ = beats.look()
        assert beats.silent(heard) == [1]
        assert beats.silent(later + 1e-3) == [1, 0]  # heard at its read, not at a look
        beats.remove(fd)
        beats.heard(fd)  # a read racing its removal: nothing is heard of a socket not watched
        assert beats.heard_at(fd) is None


def test_a_stalled_watcher_counts_everyone_heard() -> None:
    with watched(5) as (beats, _):
        now, _ = beats.look()
        assert len(beats.silent(now + 1e-3)) == 5
        beats.heard_all(now + 1)
        assert beats.silent(now + 1) == []
        assert sorted(beats.silent(now + 1.001)) == list(range(5))


def test_a_removed_socket_is_never_silent_and_its_number_is_free() -> None:
    with watched(3) as (beats, _):
        fd = _fd(beats, 1)
        beats.remove(fd)
        now, _ = beats.look()
        assert sorted(beats.silent(now)) == [0, 2]
        assert beats.heard_at(fd) is None
        beats.add(fd, 7)  # the number reused by a new connection: heard from its admission
        assert 7 not in beats.silent(now)


def test_every_socket_is_read_once_a_round() -> None:
    with watched(8, rounds=4) as (beats, _):
        read: list[int] = []
        for _ in range(4):
            read += beats.look()[1]
        assert sorted(read) == sorted(_fd(beats, k) for k in range(8))
        again = [fd for _ in range(4) for fd in beats.look()[1]]
        assert sorted(again) == sorted(read)


def test_a_parked_socket_is_read_every_few_rounds_and_a_watched_one_every_round() -> None:
    """Each parked socket is read in one lap of three, the parked ones dealt over the laps
    in turn (an even share read in each); the others in every lap."""
    with watched(8, rounds=2, parked_laps=3) as (beats, _):
        parked = [_fd(beats, k) for k in (0, 1, 2, 3)]
        for fd in parked:
            beats.park(fd)
        laps = [beats.look()[1] | beats.look()[1] for _ in range(6)]
        watched_ones = {_fd(beats, k) for k in range(4, 8)}
        dealt = [{parked[0], parked[3]}, {parked[1]}, {parked[2]}]
        assert laps == [watched_ones | share for share in dealt] * 2


def test_a_socket_read_always_is_read_at_every_arrival_and_only_then() -> None:
    with watched(3, rounds=1000) as (beats, peers):
        bellless = _fd(beats, 1)
        beats.read_always(bellless)
        assert beats.reads_always(bellless)
        assert beats.look()[1] == set()  # nothing arrived; no round due yet
        for peer in peers:
            peer.send(b"\0" * 9)
        assert beats.look()[1] == {bellless} | _round(beats, 1)
        assert beats.look()[1] == _round(beats, 2)  # nothing arrived since
        beats.remove(bellless)
        assert not beats.reads_always(bellless)


def _fd(beats: BeatSockets[int], owner: int) -> int:
    return next(fd for fd, k in beats._owners.items() if k == owner)


def _round(beats: BeatSockets[int], k: int) -> set[int]:
    return set(beats._rounds[k])


def test_a_look_sees_a_doorbell_left_unread() -> None:
    """A doorbell's SIGURG can come before its byte (the urgent pointer a segment ahead of
    it) and is not sent again when the byte comes: the look that sees the byte says so, and
    the watcher rings the batch reader (`channel`)."""
    lsock = socket.create_server(("127.0.0.1", 0))
    theirs = socket.create_connection(lsock.getsockname())
    ours, _ = lsock.accept()
    ours.setblocking(False)
    beats: BeatSockets[int] = BeatSockets()
    try:
        beats.add(ours.fileno(), 0)
        theirs.send(b"\0" * 9)  # a heartbeat: no doorbell
        beats.look()
        assert not beats.rang
        theirs.send(b"\x01", socket.MSG_OOB)
        _wait_readable(ours, select.EPOLLPRI)
        beats.look()
        assert beats.rang
        ours.recv(64)  # up to the mark
        with contextlib.suppress(BlockingIOError):
            ours.recv(64)  # past it: rung no more
        theirs.send(b"\0" * 9)
        _wait_readable(ours)
        beats.look()
        assert not beats.rang
    finally:
        beats.close()
        for s in (ours, theirs, lsock):
            s.close()


def _wait_readable(sock: socket.socket, events: int = select.EPOLLIN) -> None:
    with select.epoll() as ep:
        ep.register(sock.fileno(), events)
        assert ep.poll(10)


def test_a_read_of_bytes_that_waited_counts_as_of_when_they_came() -> None:
    """The watcher's read of a socket takes bytes that may have waited since an earlier
    look: heard at the first look at or after their arrival (`at`), not at the read; not
    again if heard since; now if they came after the newest look."""
    with watched(1) as (beats, peers):
        fd = _fd(beats, 0)
        peers[0].send(b"\0" * 9)
        first, _ = beats.look()
        second, _ = beats.look()
        assert beats.heard_at(fd) == first
        beats.heard(fd, at=first - 1.0)  # came before the look that heard it
        assert beats.heard_at(fd) == first
        beats.heard(fd, at=(first + second) / 2)  # came between two looks
        assert beats.heard_at(fd) == second
        beats.heard(fd, at=second + 3600)  # after the newest look: heard now, not later
        now = beats.heard_at(fd)
        assert now is not None and second < now < second + 3600


def test_a_parked_socket_is_neither_reported_nor_silent_and_comes_back_heard_as_of_at() -> None:
    with watched(3) as (beats, peers):
        fd = _fd(beats, 1)
        assert beats.park(fd) and not beats.park(fd) and beats.parked == 1
        peers[1].send(b"\0" * 9)
        now, _ = beats.look()
        assert beats.heard_at(fd) is None  # out of the epoll: its bytes are not seen
        assert 1 not in beats.silent(now + 100)  # nor is its silence counted
        assert fd in _round(beats, 0)  # still read in its round
        # Back: heard as of when its newest bytes came (here: before the look), not now.
        assert beats.unpark(fd, now - 0.5) and not beats.unpark(fd, now)
        heard = beats.heard_at(fd)
        assert heard is not None and heard <= now
        assert sorted(beats.silent(now + 1e-3)) == [0, 1, 2]


def test_a_parked_socket_no_read_found_bytes_on_is_starved() -> None:
    with watched(2) as (beats, _peers):
        fed, starved = _fd(beats, 0), _fd(beats, 1)
        beats.park(fed)
        beats.park(starved)
        beats.heard(fed)  # a read found its bytes (its heartbeats)
        assert beats.starved({fed, starved}) == [1]
        assert sorted(beats.starved({fed, starved})) == [0, 1]  # until the next reads


def test_a_stalled_watcher_leaves_the_parked_sockets_to_their_relays() -> None:
    with watched(2) as (beats, _peers):
        beats.park(_fd(beats, 1))
        now, _ = beats.look()
        beats.heard_all(now)
        assert beats.silent(now + 100) == [0]  # a parked one never ages into a loss
