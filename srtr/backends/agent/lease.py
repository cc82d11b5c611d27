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
import termios
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

from srtr.backends.agent import protocol as p
from srtr.backends.agent.dial import Wire

log = logging.getLogger("srtr.agent")

_ZERO = bytes(4)  # TIOCOUTQ's answer when every byte sent was acknowledged


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
        # After each heartbeat sent, with how long ago the newest acknowledged one went
        # (`relay.Role.beat`: a member tells its relay it is alive only while that is recent).
        self.on_beat: Callable[[float], None] | None = None
        self._done: asyncio.Future[str] | None = None  # `beat`'s end: why the session ends
        self._sent: float | None = None  # when the last heartbeat went
        self._ticker: _Ticker | None = None
        self._wake: asyncio.TimerHandle | None = None  # a deadline before the next heartbeat
        self._fd_of: asyncio.StreamWriter | None = None  # whose socket `_fd` is
        self._fd = -1

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
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._sent = None
        ticker = _Ticker.of(loop, period)
        self._ticker = ticker
        ticker.add(self)
        try:
            self._step(beat=True)  # the session's first heartbeat goes at once
            return await self._done
        finally:
            ticker.remove(self)
            self._ticker = None
            if self._wake is not None:
                self._wake.cancel()
                self._wake = None

    def _step(self, beat: bool) -> None:
        """Renew the lease if the last heartbeat was acknowledged, send one if `beat`, and
        fence or give up when the lease ran out; a timer of its own only for a deadline
        that falls before the next heartbeat."""
        now = time.monotonic()
        if self._sent is not None and self._acknowledged():
            self._renewed(self._sent)
        if beat and self._write_beat():
            self._sent = now
            if self.on_beat is not None:
                self.on_beat(now - self.since)
        if self.length <= 0 or self._done is None or self._done.done():
            return
        expires = self.since + self.length
        wake = expires
        if now >= expires:
            if self.fenced is None:
                self._fence(now - self.since)
            wake = max(expires + self._window, self._fenced_until)
            if now >= wake:
                self.gave_up = True
                self._done.set_result(
                    f"no word from the controller for {now - self.since:.1f}s "
                    f"(lease {self.length:g}s, then the adopt window)"
                )
                return
        self._wake_at(wake)

    def _wake_at(self, when: float) -> None:
        ticker = self._ticker
        if ticker is None or when >= ticker.next:
            return  # the next heartbeat's step comes first
        if self._wake is not None:
            if self._wake.when() == when:
                return
            self._wake.cancel()
        self._wake = ticker.loop.call_at(when, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self.step(beat=False)

    def step(self, beat: bool) -> None:
        """`_step`, its error ending this lease's `beat` (as when each lease had a task of
        its own), not the heartbeats of the other leases of its timer."""
        try:
            self._step(beat)
        except Exception as exc:
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)

    def _acknowledged(self) -> bool:
        """Whether the controller's host acknowledged every heartbeat sent so far."""
        beats = self.beats
        # What TLS still holds; bytes the socket's own transport holds mean a full kernel
        # queue, which TIOCOUTQ below sees.
        if beats is None or beats.is_closing() or beats.transport.get_write_buffer_size():
            return False
        if self._fd_of is not beats:  # the fd is the transport's until it is closing
            self._fd_of, self._fd = beats, beats.get_extra_info("socket").fileno()
        try:
            return fcntl.ioctl(self._fd, termios.TIOCOUTQ, _ZERO) == _ZERO
        except OSError:
            return False

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


# Leases a tick steps per turn of the event loop (a real agent has one).
STEPS_PER_TURN = 500


class _Ticker:
    """The heartbeats of every lease of one event loop with one period: one timer on the wall
    clock's whole periods, as every node beats (the controller then sees the heartbeats of
    many nodes per wake-up, not one: channel.py, "Heartbeats"). A hollow process's thousands
    of agents then cost one wake-up a period, not one task step each; a real agent's one
    lease costs what its own timer did. Each heartbeat still goes on its own agent's socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop, period: float) -> None:
        self.loop = loop
        self.period = period
        self.leases: dict[Lease, None] = {}  # in the order they joined
        self.next = 0.0  # the next tick's monotonic time
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop, period: float) -> _Ticker:
        tickers = _TICKERS.setdefault(loop, {})
        ticker = tickers.get(period)
        if ticker is None:
            ticker = tickers[period] = cls(loop, period)
        return ticker

    def add(self, lease: Lease) -> None:
        self.leases[lease] = None
        if self._timer is None:
            self._schedule()

    def remove(self, lease: Lease) -> None:
        self.leases.pop(lease, None)
        if not self.leases and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            _TICKERS.get(self.loop, {}).pop(self.period, None)

    def _schedule(self) -> None:
        self.next = time.monotonic() + self.period - time.time() % self.period
        self._timer = self.loop.call_at(self.next, self._tick)

    def _tick(self) -> None:
        self._schedule()  # first: a lease's deadline is compared with the next tick
        self._step(list(self.leases), 0)

    def _step(self, leases: list[Lease], start: int) -> None:
        """Step `leases` from `start`, `STEPS_PER_TURN` of them, the rest in the loop's
        next turns: a hollow process's 10,000 steps in one turn held every other callback
        (its agents' launch answers) back ~0.15 s a period, and the controller's launches
        waited. The loop runs nothing else between two slices when it has nothing else."""
        end = start + STEPS_PER_TURN
        for lease in leases[start:end]:
            if lease in self.leases:  # not removed by an earlier one's step
                lease.step(beat=True)
        if end < len(leases):
            self.loop.call_soon(self._step, leases, end)


_TICKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, _Ticker]] = (
    weakref.WeakKeyDictionary()
)
