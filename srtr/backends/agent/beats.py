"""The agents' sockets as the silence watcher sees them: when each last had bytes arrive.

A heartbeat says only that it came (`frames`), so it is never read on its own and never
wakes the event loop: every agent's socket sits, besides the batch reader's epoll (which
wakes the loop for a message's doorbell only), in an epoll of its own, edge-triggered, that
only `look` polls, on the watcher's ticks (`channel`, "Heartbeats"). Edge-triggered, the
kernel reports each socket once per look however many bytes came, and whether or not the
earlier ones were read, but only if some are still unread at the look: the kernel checks
the socket again as it reports it. A socket whose new bytes were all read before the look
(the batch reader reads a message on its doorbell, and the heartbeat before it with it) is
not reported, so each read counts as hearing its socket (`heard`): a node answering every
second would be silent to the looks alone.

Why not the batch reader's epoll (`coalesced`), which the loop watches: that epoll leaves the
loop's for each batch window and joins it again after, and joining one epoll to another
walks every socket in it (the kernel's loop and path checks). With 1,024 heartbeats a
second spread over several windows, that walk was most of an idle controller's CPU.

No Python runs per heartbeat (10,000 a second at 10,000 agents, where 1 % of a core leaves
~1 µs for each): a look's sockets become one generation, a dict `fd -> its number` built and
merged into `last` (each socket's newest generation) in C; the silent sockets are those of a
generation older than the silence whose newest generation it still is, a set intersection
of that generation's items with `last`'s. Each generation is looked at once, as it ages past
the silence, then forgotten. A socket's read (its heartbeats' tags checked, its receive
buffer emptied) comes round once every `rounds` looks, a fixed slice of the sockets a look,
except for the sockets set to be read at each arrival (`read_always`).

A socket whose agent's relay vouches for it (`relayed`) is `park`ed: out of the epoll (no
report per heartbeat) and out of the silence's reckoning, still in its round of reads; it
comes back (`unpark`) heard as of its own newest bytes (`newest_arrival`), never on a
relay's word.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Set as AbstractSet
from typing import Generic, TypeVar

# Urgent data too: the kernel computes it for every report anyway, and a look that sees a
# doorbell not yet read rings the batch reader (`rang`): its SIGURG may have come before
# its byte (the urgent pointer can arrive a segment ahead of the byte it points to), and the
# kernel does not signal the byte again when it comes.
_EDGE = select.EPOLLIN | select.EPOLLPRI | select.EPOLLET
_PRI = select.EPOLLPRI

T = TypeVar("T")

# struct tcp_info: `tcpi_last_data_recv` (ms since the newest data came, counted in the
# kernel's ticks) is the 4th u32 after 8 u8s and 9 u32s. A tick is 1-10 ms (CONFIG_HZ):
# the margin keeps the estimate no earlier than the bytes came, as the lease needs.
_TCP_INFO_BYTES = 60
_LAST_DATA_RECV = 52
_TICKS_MARGIN = 0.02


def newest_arrival(sock: socket.socket | None) -> float | None:
    """When (monotonic) the newest bytes on `sock` came, at the latest; None if unknown."""
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
        ago_ms: int = struct.unpack_from("I", info, _LAST_DATA_RECV)[0]
    except (OSError, struct.error):
        return None
    return time.monotonic() - ago_ms / 1000 + _TICKS_MARGIN


class _Generation:
    """The sockets heard at one look (or between two: admitted, or read), and when."""

    __slots__ = ("fds", "number", "when")

    def __init__(self, number: int, when: float) -> None:
        self.number = number
        self.when = when
        self.fds: dict[int, int] = {}  # fd -> number: ready for `last.update` and `&`


class BeatSockets(Generic[T]):
    """Sockets added with what each one is for (`T`); when each was last heard; which are
    silent; which to read at a look."""

    def __init__(self, rounds: int = 1, parked_laps: int = 1) -> None:
        self._epoll = select.epoll()
        self._owners: dict[int, T] = {}
        self._last: dict[int, int] = {}  # fd -> the number of its newest generation
        self._generations: deque[_Generation] = deque()  # oldest first
        self._when: dict[int, float] = {}  # generation number -> its time (the kept ones)
        self._number = 0
        self._between: _Generation | None = None  # the newest, if heard between looks
        # The sockets read at a look: round k's at looks k, k + rounds, ...
        self._rounds: list[dict[int, None]] = [{} for _ in range(max(1, rounds))]
        self._round_of: dict[int, int] = {}
        self._turn = 0
        self._looks = 0
        self._always: dict[int, None] = {}
        # Out of the epoll (a relay vouches for them), each read in one lap of every
        # `_parked_laps`: its phase. Phases are dealt in turn, so every lap reads an even
        # share of them and an idle controller's cost is the same in each round.
        self._parked: dict[int, int] = {}
        self._parked_laps = max(1, parked_laps)
        self._deal = 0
        self._fed: set[int] = set()  # parked ones read with bytes since the last `starved`
        self.rang = False  # the last look saw urgent data unread on some socket

    def __len__(self) -> int:
        return len(self._owners)

    def add(self, fd: int, owner: T) -> None:
        """Watch `fd` (a non-blocking socket) from now on, for `owner`; heard now."""
        self._epoll.register(fd, _EDGE)
        self._owners[fd] = owner
        self.heard(fd)
        turn = self._turn = (self._turn + 1) % len(self._rounds)  # rounds of even sizes
        self._rounds[turn][fd] = None
        self._round_of[fd] = turn

    def remove(self, fd: int) -> None:
        """Stop watching `fd`; call before its socket is closed (the number may be reused)."""
        if self._owners.pop(fd, None) is not None:
            self._last.pop(fd, None)
            self._parked.pop(fd, None)
            self._rounds[self._round_of.pop(fd)].pop(fd, None)
            self._always.pop(fd, None)
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def heard(self, fd: int, at: float | None = None) -> None:
        """`fd` is heard now, between looks: admitted, or read (a read takes the bytes a look
        would have reported: edge-triggered, a look reports only sockets still readable).

        `at`: its newest bytes came no later than that (the watcher's own read, of bytes
        that may have waited there since an earlier look): heard at the first look at or
        after `at`, or now if none was; not at all if it was heard since. A frozen node's
        last heartbeats, read by its round after it froze, would otherwise have been heard
        at that read, up to a silence late."""
        if fd not in self._owners:
            return
        if fd in self._parked:  # its relay's word, not ours; its round checks it had bytes
            self._fed.add(fd)
            return
        if at is not None:
            for kept in self._generations:  # a dozen: the silence's looks
                if kept.when >= at:
                    if self._last.get(fd, 0) < kept.number:
                        kept.fds[fd] = self._last[fd] = kept.number
                    return
        now = time.monotonic()
        gen = self._between
        if gen is None:
            gen = self._between = self._new(now)
        gen.when = self._when[gen.number] = now  # not earlier than anything heard in it
        gen.fds[fd] = self._last[fd] = gen.number

    def park(self, fd: int) -> bool:
        """Stop hearing `fd` (its relay vouches for it): out of the epoll and of the silence's
        reckoning, still read in its round. Whether it was watched and is parked now."""
        if fd not in self._owners or fd in self._parked:
            return False
        with contextlib.suppress(OSError):
            self._epoll.unregister(fd)
        self._parked[fd] = self._deal
        self._deal = (self._deal + 1) % self._parked_laps
        self._last.pop(fd, None)
        return True

    def unpark(self, fd: int, at: float | None) -> bool:
        """Hear `fd` again: back in the epoll, heard as of `at` (when its newest bytes came;
        None: now). Read it after (`read`): edge-triggered, its bytes already there would
        otherwise be reported at the next look, as if they had just come."""
        if fd not in self._parked:
            return False
        del self._parked[fd]
        with contextlib.suppress(FileExistsError):  # its park could not take it out
            self._epoll.register(fd, _EDGE)
        self.heard(fd, at)
        return True

    def is_parked(self, fd: int) -> bool:
        return fd in self._parked

    @property
    def parked(self) -> int:
        """How many sockets are parked."""
        return len(self._parked)

    def starved(self, fds: set[int]) -> list[T]:
        """The owners of the parked sockets among `fds` (a look's round) that no read found
        bytes on since the last call."""
        found = [self._owners[fd] for fd in (fds & self._parked.keys()) - self._fed]
        self._fed.clear()
        return found

    def read_always(self, fd: int) -> None:
        """Read `fd` at every look that finds bytes arrived on it, not once a round."""
        if fd in self._owners:
            self._always[fd] = None

    def reads_always(self, fd: int) -> bool:
        return fd in self._always

    def look(self) -> tuple[float, set[int]]:
        """Poll: every socket that had bytes arrive since the last look is heard now.
        Returns now, and the sockets to read now (this look's round, and those read always
        that had bytes arrive)."""
        heard: dict[int, int] = {}
        if self._owners and not self._epoll.closed:
            heard = dict(self._epoll.poll(0, len(self._owners)))
        now = time.monotonic()  # after the poll: never earlier than an arrival it saw
        gen = self._new(now)
        gen.fds = dict.fromkeys(heard, gen.number)
        self._last.update(gen.fds)
        # In C: the events of a look are nearly all plain EPOLLIN, so a handful of values.
        self.rang = any(events & _PRI for events in set(heard.values()))
        lap, turn = divmod(self._looks, len(self._rounds))
        self._looks += 1
        due: AbstractSet[int] = self._rounds[turn].keys()
        if self._parked_laps > 1 and self._parked:
            phase, parked = lap % self._parked_laps, self._parked
            due = {fd for fd in due if parked.get(fd, phase) == phase}
        return now, (self._always.keys() & heard.keys()) | due

    def heard_all(self, now: float) -> None:
        """Count every socket as heard `now` (the watcher was not running: their bytes may
        be waiting unseen), but the parked ones: their relays speak for them."""
        gen = self._new(now)
        gen.fds = dict.fromkeys(self._owners.keys() - self._parked, gen.number)
        self._last.update(gen.fds)
        while self._generations[0] is not gen:
            self._forget_oldest()

    def silent(self, cutoff: float) -> list[T]:
        """The owners of the sockets last heard before `cutoff`, longest silent first."""
        found: list[T] = []
        last = self._last.items()
        for gen in self._generations:
            if gen.when >= cutoff:
                break
            for fd, _ in sorted(gen.fds.items() & last):
                found.append(self._owners[fd])
        return found

    def forget(self, cutoff: float) -> None:
        """Drop the generations before `cutoff`: call once their silent sockets were removed
        (a socket's `heard_at` needs its newest generation's time)."""
        while self._generations and self._generations[0].when < cutoff:
            self._forget_oldest()

    def heard_at(self, fd: int) -> float | None:
        """When `fd` was last heard (its newest generation's time), None if it is not watched."""
        number = self._last.get(fd)
        return None if number is None else self._when.get(number)

    def close(self) -> None:
        self._owners.clear()
        self._last.clear()
        self._parked.clear()
        self._fed.clear()
        self._epoll.close()

    def _new(self, now: float) -> _Generation:
        self._number += 1
        gen = _Generation(self._number, now)
        self._generations.append(gen)
        self._when[gen.number] = now
        self._between = None
        return gen

    def _forget_oldest(self) -> None:
        gen = self._generations.popleft()
        self._when.pop(gen.number, None)
        if gen is self._between:
            self._between = None
