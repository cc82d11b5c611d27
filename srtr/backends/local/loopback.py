"""Loopback blocks: the addresses of one local job's simulated nodes, held by no other job.

Every local job simulates its nodes on loopback addresses, and 127.0.0.0/8 is one network
for the whole machine: two jobs on the same addresses share every port, so a restarted rank
of one job could join the other's rendezvous on the same port. So each local job takes a
block of its own, `127.B.0.0/16` (B = 0..255): node K is 127.B.0.1 + K, as node K of block
0 always was 127.0.0.1 + K. The first free block is taken, so a job that is alone gets block
0 and the addresses it always had (and that `srtr plan` prints).

A block is held by binding an abstract unix socket named after it (never listening, so
nothing can connect to it). Abstract sockets belong to the network namespace, as the
loopback addresses do, are seen by every user, and go away with the last process that holds
them: a block is never left taken by a job that is gone, and never handed to two jobs at
once. The job's guard inherits the socket, so the block stays the job's while a crashed
controller's instances wait to be adopted.

Each block has two slots: a new job takes a block only when both are free and keeps one; a
controller adopting the job takes the slot the crashed controller's guard does not hold
(`reclaim`), so the block is never free between the two.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from dataclasses import dataclass, field

BLOCKS = 256  # 127.0.0.0/16 .. 127.255.0.0/16
# Nodes of one block: 127.B.0.2 .. 127.B.255.254 (127.B.0.1 is not a node's; block 0's is
# the host's own 127.0.0.1).
BLOCK_NODES = 65533
SLOTS = 2
_PREFIX = "srtr-loopback"


class NetworkTaken(Exception):
    """No loopback block is free (or, adopting, the job's block is held by others)."""


@dataclass
class LoopbackBlock:
    """A block `127.<index>.0.0/16` and the sockets that hold it (none: not claimed, as
    for a backend built without a job, e.g. in tests)."""

    index: int = 0
    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def cidr(self) -> str:
        return f"127.{self.index}.0.0/16"

    def ip(self, node: int) -> str:
        """The address of node number `node` (1-based) of the block.

        Raises:
            ValueError: the block has no such node.
        """
        if not 1 <= node <= BLOCK_NODES:
            raise ValueError(
                f"a local job has at most {BLOCK_NODES} nodes (its loopback block "
                f"{self.cidr}); node {node} is past it"
            )
        value = (127 << 24) + (self.index << 16) + 1 + node
        return f"127.{self.index}.{(value >> 8) & 255}.{value & 255}"

    def fds(self) -> tuple[int, ...]:
        """The descriptors that hold the block, for the guard to inherit."""
        return tuple(s.fileno() for s in self.sockets)

    def release(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.sockets.clear()


def _name(index: int, slot: int) -> bytes:
    return f"\0{_PREFIX}/127.{index}.0.0/16#{slot}".encode()


def _bind(index: int, slot: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(_name(index, slot))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return sock


def held(index: int) -> bool:
    """Whether some job holds block `index` now (a look only: nothing is kept)."""
    for slot in range(SLOTS):
        sock = _bind(index, slot)
        if sock is None:
            return True
        sock.close()
    return False


def claim() -> LoopbackBlock:
    """The first block no job holds, held from now until `release` or this process's end.

    Raises:
        NetworkTaken: every block is held.
    """
    for index in range(BLOCKS):
        first = _bind(index, 0)
        if first is None:
            continue
        second = _bind(index, 1)  # held by an adopted job's old guard: not free
        if second is None:
            first.close()
            continue
        second.close()
        return LoopbackBlock(index, [first])
    raise NetworkTaken(
        f"every loopback block (127.0.0.0/16 .. 127.{BLOCKS - 1}.0.0/16) is held by another "
        "local job; stop one of them"
    )


def reclaim(index: int) -> LoopbackBlock:
    """Block `index` again, for a controller that adopts the job holding it: the slot its
    crashed controller's guard does not hold.

    Raises:
        NetworkTaken: both slots are held (another controller holds the job already).
    """
    for slot in range(SLOTS):
        sock = _bind(index, slot)
        if sock is not None:
            return LoopbackBlock(index, [sock])
    raise NetworkTaken(f"the job's loopback block 127.{index}.0.0/16 is held by other processes")


def block_of(cidr: str | None) -> int:
    """The block index of a state.json `network` (`127.B.0.0/16`); 0 when absent (a job
    recorded before blocks existed used block 0)."""
    if not cidr:
        return 0
    parts = cidr.split("/")[0].split(".")
    if len(parts) != 4 or parts[0] != "127" or not parts[1].isdigit():
        raise ValueError(f"not a loopback block: {cidr!r}")
    index = int(parts[1])
    if not 0 <= index < BLOCKS:
        raise ValueError(f"not a loopback block: {cidr!r}")
    return index
