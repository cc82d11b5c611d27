"""An agent's part in its relay group (docs/agents.md, "Relays"; the controller's side is
`relayed`).

A member (`p.RelayTo`) sends its group's relay one datagram a heartbeat period, right after
its heartbeat, and only while its own lease holds (its last heartbeat but one was
acknowledged by the controller's host: `Lease.on_beat`): a relayed "alive" then also says
that its direct link works. A datagram is its index in the group, a number that only grows
(the wall clock in µs, so a new process of the same node goes on from there), and a keyed
BLAKE2b tag of both under the group's key (which travelled inside TLS): other users of the
network can neither forge one nor replay an old one.

A relay (`p.Relay`) binds a UDP port on the address its own connection to the controller
comes from, answers `p.Relaying` with it, and once a period, right after its own heartbeat,
sends `p.Relayed`: the members whose newest datagram is older than `STALE` periods.

Standard library and the protocol only, as the node agent it is part of. In hollow mode
(`deliver_in_process`) a member whose relay is simulated in the same process hands it its
datagram directly, the same bytes checked the same way, without the two system calls (the
controller sees neither); each relay still binds its own socket, as on a real node, and
members whose relay is elsewhere share one sending socket (10,000 more descriptors would not
fit the host's limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
import struct
import time
from collections.abc import Callable

from srtr.backends.agent import protocol as p

log = logging.getLogger("srtr.agent")

_HEAD = struct.Struct(">IQ")  # the member's index, its datagram's number
TAG = 8
DATAGRAM = _HEAD.size + TAG
# A member not heard for longer than this many periods is missing from the record: it sends
# every period, on the wall clock's whole periods as its relay does, so one period plus the
# nodes' clocks and a busy loop's lateness. A member that stopped is missing from the second
# record after its last datagram all the same (ages come in whole periods).
STALE = 1.5
# A member relays only while its newest acknowledged heartbeat went at most this many
# periods ago (the lease is renewed once a period, from the heartbeat before).
HEALTHY = 1.5
# A relay's record goes when what it says changes, and at least every this many periods
# (the controller's proof that the relay still speaks; `relayed.LATE`): an idle group of
# 100 nodes then costs the controller one read in 8 s, not one a second.
KEEPALIVE = 8
_MOST_PER_READ = 4096  # datagrams a relay takes per wake-up (the rest at the next)


def tag(key: bytes, head: bytes) -> bytes:
    return hashlib.blake2b(head, key=key, digest_size=TAG).digest()


def datagram(key: bytes, index: int, number: int) -> bytes:
    head = _HEAD.pack(index, number)
    return head + tag(key, head)


def _keyed(key: bytes) -> Callable[[bytes], bytes]:
    """`tag` under `key`, from a copy of the state that has taken the key already (a keyed
    BLAKE2b hashes its key as a block of its own first: a hollow process tags 10,000
    datagrams a second, and checks as many)."""
    keyed = hashlib.blake2b(key=key, digest_size=TAG)

    def tagged(head: bytes) -> bytes:
        state = keyed.copy()
        state.update(head)
        return state.digest()

    return tagged


class Listening:
    """A relay's UDP socket and what it heard of each member."""

    def __init__(self, key: bytes, count: int, own: int, host: str) -> None:
        self._tag = _keyed(key)
        self._own = own
        self._heard = [float("-inf")] * count  # monotonic: each member's newest datagram
        self._numbers = [0] * count  # its number: an older or replayed one is dropped
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self._sock.setblocking(False)
            with contextlib.suppress(OSError):  # room for a period's datagrams (the kernel caps it)
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048 * (count + 16))
            self._sock.bind((host, 0))
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self.read)
        self._local = (host, self.port)
        if _LOCAL is not None:
            _LOCAL[self._local] = self

    def read(self) -> None:
        """Take the datagrams waiting (the loop calls it when some came)."""
        now = time.monotonic()
        recv, take = self._sock.recv, self.take
        with contextlib.suppress(OSError):  # none waiting (BlockingIOError) or the socket's end
            for _ in range(_MOST_PER_READ):
                take(recv(DATAGRAM + 1), now)

    def take(self, data: bytes, now: float) -> bool:
        """Count a datagram heard at `now`; whether it was a member's, new and genuine."""
        if len(data) != DATAGRAM:
            return False
        index, number = _HEAD.unpack_from(data)
        if index >= len(self._heard) or number <= self._numbers[index]:
            return False
        if not hmac.compare_digest(data[_HEAD.size :], self._tag(data[: _HEAD.size])):
            return False
        self._numbers[index] = number
        self._heard[index] = now
        return True

    def missing(self, now: float, period: float) -> list[int]:
        """The members not heard for longer than `STALE` periods at `now`."""
        stale = now - STALE * period
        own = self._own
        return [i for i, at in enumerate(self._heard) if at < stale and i != own]

    def close(self) -> None:
        if _LOCAL is not None and _LOCAL.get(self._local) is self:
            del _LOCAL[self._local]
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


# One sending socket per address family for the whole process (hollow mode's members).
_SENDERS: dict[int, socket.socket] = {}
# Hollow mode: this process's relays by (address, port), once `deliver_in_process` is called.
_LOCAL: dict[tuple[str, int], Listening] | None = None


def deliver_in_process() -> None:
    """From now on a member hands its datagram to a relay of this same process directly
    (hollow mode: 10,000 simulated members and their 100 relays in one process, where a
    `sendto` and a `recv` per datagram were ~3 % of a core, idle 20 % → 17 %; a real node's
    relay is another process, which only the network reaches)."""
    global _LOCAL
    if _LOCAL is None:
        _LOCAL = {}


def _sender(family: int) -> socket.socket:
    sock = _SENDERS.get(family)
    if sock is None or sock.fileno() < 0:
        sock = _SENDERS[family] = socket.socket(family, socket.SOCK_DGRAM)
        sock.setblocking(False)
    return sock


class Sending:
    """A member's datagrams to its relay."""

    def __init__(self, host: str, port: int, key: bytes, index: int) -> None:
        self._to = (host, port)
        self._tag = _keyed(key)
        self._index = index
        self._number = 0
        self._sock = _sender(socket.AF_INET6 if ":" in host else socket.AF_INET)

    def send(self) -> None:
        self._number = number = max(self._number + 1, time.time_ns() // 1000)
        head = _HEAD.pack(self._index, number)
        local = None if _LOCAL is None else _LOCAL.get(self._to)
        if local is not None:  # its relay is simulated here: what its read would take
            local.take(head + self._tag(head), time.monotonic())
            return
        with contextlib.suppress(OSError):  # a full buffer or no route: the relay misses it
            self._sock.sendto(head + self._tag(head), self._to)


class Role:
    """An agent's part in its group: none, a member's, a relay's, or both in turn."""

    def __init__(
        self, node: str, send: Callable[[p.Message], None], post: Callable[[p.Message], None]
    ) -> None:
        """`send`: a message with its doorbell; `post`: one without (the records)."""
        self._node = node
        self._send = send
        self._post = post
        self.period = 1.0  # the session's heartbeat period
        self.listening: Listening | None = None
        self.sending: Sending | None = None
        self._said: list[int] | None = None  # the last record's missing members
        self._quiet = 0  # periods since the last record

    def handle(self, message: p.Relay | p.RelayTo, host: str) -> None:
        """The controller's `Relay` or `RelayTo`; `host`: the address our own connection
        to it comes from (a relay binds its UDP port there)."""
        if isinstance(message, p.RelayTo):
            self.sending = None
            if message.port > 0:
                key = bytes.fromhex(message.key)
                self.sending = Sending(message.host, message.port, key, message.index)
            return
        self._stop_listening()
        if message.count <= 0:
            return
        try:
            self.listening = Listening(
                bytes.fromhex(message.key), message.count, message.index, host
            )
        except (OSError, ValueError) as exc:
            log.warning("agent %s: cannot relay for its group: %s", self._node, exc)
            self._send(p.Relaying(0, str(exc)))
            return
        log.info(
            "agent %s: relays for %d nodes on UDP port %d",
            self._node,
            message.count - 1,
            self.listening.port,
        )
        self._send(p.Relaying(self.listening.port))

    def beat(self, age: float) -> None:
        """Right after a heartbeat: `age`, how long ago the newest acknowledged one went."""
        if self.sending is not None and age <= HEALTHY * self.period:
            self.sending.send()
        if self.listening is not None:
            missing = self.listening.missing(time.monotonic(), self.period)
            self._quiet += 1
            if missing != self._said or self._quiet >= KEEPALIVE:
                self._post(p.Relayed(missing))
                self._said, self._quiet = missing, 0

    def reset(self) -> None:
        """A session ended: its controller's groups are no more."""
        self.sending = None
        self._stop_listening()

    def _stop_listening(self) -> None:
        self._said = None
        if self.listening is not None:
            self.listening.close()
            self.listening = None
