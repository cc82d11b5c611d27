"""The agents' sockets as the silence watcher sees them: which had bytes arrive since it looked.

A heartbeat says only that it came (`frames`), so it is never read on its own and never
wakes the event loop: every agent's socket sits, besides the batch reader's epoll (which
wakes the loop for a message's doorbell only), in an epoll of its own, edge-triggered, that
only `arrived` polls, on the watcher's ticks (`channel`, "Heartbeats"). Edge-triggered, the
kernel reports each socket once per look however many bytes came, and whether or not the
earlier ones were read; the channel reads them every few heartbeats.

Why not the batch reader's epoll (`coalesced`), which the loop watches: that epoll leaves the
loop's for each batch window and joins it again after, and joining one epoll to another
walks every socket in it (the kernel's loop and path checks). With 1,024 heartbeats a
second spread over several windows, that walk was most of an idle controller's CPU.
"""

from __future__ import annotations

import contextlib
import select
from typing import Generic, TypeVar

_EDGE = select.EPOLLIN | select.EPOLLET | select.EPOLLRDHUP
HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR

T = TypeVar("T")


class BeatSockets(Generic[T]):
    """Sockets added with what each one is for (`T`); which had something arrive."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._owners: dict[int, T] = {}

    def add(self, fd: int, owner: T) -> None:
        """Watch `fd` (a non-blocking socket) from now on, for `owner`."""
        self._epoll.register(fd, _EDGE)
        self._owners[fd] = owner

    def remove(self, fd: int) -> None:
        """Stop watching `fd`; call before its socket is closed (the number may be reused)."""
        if self._owners.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def arrived(self) -> list[tuple[T, int]]:
        """(owner, epoll flags) of every socket that had bytes or a hang-up arrive since the
        last look; `HANGUP` among the flags: its peer closed or reset it."""
        if self._epoll.closed or not self._owners:
            return []
        owners = self._owners
        found = []
        for fd, events in self._epoll.poll(0, len(owners)):
            owner = owners.get(fd)
            if owner is not None:
                found.append((owner, events))
        return found

    def close(self) -> None:
        self._owners.clear()
        self._epoll.close()
