"""The node agent's lease: the agent fences itself when cut off from its controller.

Before each heartbeat the agent asks its kernel whether everything it sent on its
connection was acknowledged (TIOCOUTQ is 0): then the controller's host received the
previous heartbeat, and the lease runs from when that one was sent. With none acknowledged
for the lease (`Welcome.lease`, 5 s), the agent SIGTERMs every instance, SIGKILLs each one
still there after its grace, and logs why: the controller, which saw the same silence from
its side, may then start their replacements elsewhere, and no instance runs twice
(docs/agents.md, "The lease"). The acknowledgement is the kernel's, not the controller's: a
controller that is only stalled keeps its agents' leases (and does not count its own stall
as their silence), and one that judged a node lost resets that node's connection at once,
so nothing later is acknowledged. The agent keeps the connection, and the instances'
exits queued on it, for the adopt window: a link that comes back ends the dead connection,
and the agent looks for a controller through the rendezvous file as after a crash.

Standard library and the protocol only, as the node agent it is part of.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import signal
import sys
import termios
import time
from collections.abc import Sequence
from typing import Protocol

from srtr.backends.agent import protocol as p
from srtr.backends.agent.dial import Wire

log = logging.getLogger("srtr.agent")


class _Attempt(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def attempt(self) -> int: ...


class _Instances(Protocol):
    """What the lease stops: the node's instance attempts (`node.Runner`)."""

    def signal(self, name: str, signum: int) -> None: ...
    def get(self, name: str) -> _Attempt | None: ...
    def attempts(self) -> Sequence[_Attempt]: ...


class Lease:
    """One node agent's lease, its heartbeats that renew it, and its fence."""

    def __init__(self, node: str, instances: _Instances, window: float) -> None:
        """`window`: the adopt window, waited after the lease ran out before giving up."""
        self.node = node
        self._groups = instances
        self._window = window
        # This session's: its length (0: none), the monotonic time it runs from.
        self.length = 0.0
        self.since = 0.0
        self.beats: asyncio.StreamWriter | None = None  # this session's connection
        self.wire: Wire | None = None  # and how its heartbeats go on it
        self.fenced: str | None = None  # why the agent fenced itself, while it is
        self._fenced_until = 0.0  # when its last instance's grace ends
        self.gave_up = False  # no word for the lease and the adopt window: stop for good
        self.graces: dict[str, float] = {}  # each live instance's SIGTERM-to-SIGKILL
        self.muted = False  # sends no heartbeat (hollow mode's frozen node)

    def granted(self, length: float, since: float) -> None:
        """A controller welcomed us: a lease of `length` seconds runs from `since`
        (monotonic), and a fence is over."""
        self.length, self.since = length, since
        if self.fenced is not None:
            log.warning("agent %s: a controller welcomed us back; the fence is over", self.node)
            self.fenced = None

    async def beat(self, period: float) -> str:
        """Send heartbeats and keep the lease: fence when it runs out, and return (ending
        the session) once the fence is done and the adopt window passed with no word."""
        # On whole periods of the wall clock, as every other node does: the controller then
        # sees the heartbeats of many nodes per wake-up, not one (channel.py, "Heartbeats").
        sent: float | None = None  # when the last heartbeat went
        due = time.monotonic()
        while True:
            now = time.monotonic()
            if sent is not None and self._acknowledged():
                self._renewed(sent)
            if now >= due:
                if self._write_beat():
                    sent = now
                due = now + period - time.time() % period
            wake = due
            if self.length > 0:
                expires = self.since + self.length
                if now < expires:
                    wake = min(wake, expires)
                else:
                    if self.fenced is None:
                        self._fence(now - self.since)
                    ends = max(expires + self._window, self._fenced_until)
                    if now >= ends:
                        self.gave_up = True
                        return (
                            f"no word from the controller for {now - self.since:.1f}s "
                            f"(lease {self.length:g}s, then the adopt window)"
                        )
                    wake = min(wake, ends)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))

    def _acknowledged(self) -> bool:
        """Whether the controller's host acknowledged every heartbeat sent so far."""
        beats = self.beats
        # What TLS still holds; bytes the socket's own transport holds mean a full kernel
        # queue, which TIOCOUTQ below sees.
        if beats is None or beats.is_closing() or beats.transport.get_write_buffer_size():
            return False
        sock = beats.get_extra_info("socket")
        try:
            unacked = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(unacked, sys.byteorder) == 0

    def _renewed(self, sent: float) -> None:
        """A heartbeat sent at `sent` was acknowledged: the lease runs from then."""
        self.since = max(self.since, sent)
        if self.fenced is not None and time.monotonic() < self.since + self.length:
            log.warning("agent %s: the controller hears us again; the fence is over", self.node)
            self.fenced = None

    def _fence(self, silence: float) -> None:
        """Cut off for the lease: stop every instance (SIGTERM, SIGKILL after its grace)."""
        why = f"no word from the controller for {silence:.1f}s (lease {self.length:g}s)"
        self.fenced = why
        attempts = list(self._groups.attempts())
        log.warning(
            "agent %s: %s: fencing: SIGTERM to %d instance(s), SIGKILL after their grace; "
            "waiting %gs for the controller",
            self.node,
            why,
            len(attempts),
            self._window,
        )
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        self._fenced_until = now
        for live in attempts:
            grace = self.graces.get(live.name, p.DEFAULT_GRACE)
            self._groups.signal(live.name, signal.SIGTERM)
            loop.call_later(grace, self._fence_kill, live.name, live.attempt, grace)
            self._fenced_until = max(self._fenced_until, now + grace + 1.0)

    def _fence_kill(self, name: str, attempt: int, grace: float) -> None:
        live = self._groups.get(name)
        if live is not None and live.attempt == attempt:
            log.warning(
                "agent %s: fenced %s still running %gs after SIGTERM: SIGKILL",
                self.node,
                name,
                grace,
            )
            self._groups.signal(name, signal.SIGKILL)

    def _write_beat(self) -> bool:
        """One heartbeat; whether it went."""
        beats, wire = self.beats, self.wire
        if self.muted or beats is None or wire is None or beats.is_closing():
            return False
        try:
            wire.beat()
        except OSError:
            return False
        return True
