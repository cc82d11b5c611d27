"""Provisioners: where a run gets nodes beyond its allocation, and gives them back (what a
user sees of it: docs/recipe.md, "Growing past the allocation").

A live edit that grows a pool past the spare nodes asks the backend's provisioner for the
missing nodes (`request`), follows the request (`state`: Pending with the provider's reason,
Granted with the nodes, Refused with its message), and on shrink gives nodes back
(`release`) or drops a request that has not been granted (`cancel`). Every side effect of
growing lives here; planning only says how many nodes are missing (`carving.GrowNeeded`).

`LocalProvisioner` simulates a provider for the local backend: a request is a pending job
that is granted after a delay (`SRTR_LOCAL_PROVISION_DELAY` seconds, default 2), with new
simulated nodes on the next addresses of the job's loopback block;
`SRTR_LOCAL_PROVISION_REFUSE` makes every request refused with that message, as a provider's
limit would.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from srtr.backends.base import NodeInfo
from srtr.backends.local.loopback import BLOCK_NODES, LoopbackBlock

DELAY_ENV = "SRTR_LOCAL_PROVISION_DELAY"
REFUSE_ENV = "SRTR_LOCAL_PROVISION_REFUSE"
DEFAULT_DELAY = 2.0


class RequestPhase(enum.StrEnum):
    PENDING = "Pending"
    GRANTED = "Granted"
    REFUSED = "Refused"
    CANCELLED = "Cancelled"
    RELEASED = "Released"


@dataclass(frozen=True)
class RequestState:
    """One grow request as the provider last reported it; saved in state.json (`to_json`).

    `nodes` are the granted nodes still held (a partial release drops some); `reason` is
    the provider's word while pending (squeue's reason on SLURM) or its refusal message.
    """

    id: str
    count: int
    phase: RequestPhase
    reason: str = ""
    nodes: tuple[NodeInfo, ...] = ()

    @property
    def live(self) -> bool:
        """The provider still holds something for the run: release or cancel it at the end."""
        return self.phase in (RequestPhase.PENDING, RequestPhase.GRANTED)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "count": self.count,
            "phase": str(self.phase),
            "reason": self.reason,
            "nodes": [{"name": n.name, "ip": n.ip} for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestState:
        return cls(
            id=str(data["id"]),
            count=int(data["count"]),
            phase=RequestPhase(data["phase"]),
            reason=str(data.get("reason", "")),
            nodes=tuple(NodeInfo(str(n["name"]), str(n["ip"])) for n in data.get("nodes", [])),
        )


def pending_reason(provider: str, state: RequestState) -> str:
    """The pool's Pending reason in state.json, events, `srtr status` and the TUI."""
    return (
        f"waiting for {state.count} node(s) from {provider} "
        f"(request {state.id}: {state.reason or 'pending'})"
    )


class ProvisionError(Exception):
    """The provider refused the request outright; the message is the provider's."""


class Provisioner(Protocol):
    """What the controllers may ask of a provider of extra nodes. Async where a real provider
    runs commands (sbatch, squeue, scancel); a provider polls its queue at its own pace."""

    provider: str  # shown in reasons: "local", "SLURM"

    async def request(self, run: str, count: int) -> str:
        """Ask for `count` more nodes for run `run`; returns the request's id.

        Raises:
            ProvisionError: the provider refused it (bad partition, a limit).
        """
        ...

    async def state(self, request_id: str) -> RequestState:
        """The request as the provider sees it now."""
        ...

    async def release(self, request_id: str, nodes: Sequence[str]) -> RequestState:
        """Give granted `nodes` of the request back; the request ends with its last node."""
        ...

    async def cancel(self, request_id: str) -> RequestState:
        """Drop the request, granted or not: its nodes go back. Idempotent."""
        ...

    def requests(self) -> list[RequestState]:
        """Every request of this run, as last known (what state.json records)."""
        ...

    async def close(self) -> None:
        """Cancel every live request: nothing outlives the run. Idempotent."""
        ...


@dataclass
class _Simulated:
    state: RequestState
    granted_at: float
    names: tuple[NodeInfo, ...] = field(default=())


class LocalProvisioner:
    """Simulated provider for the local backend: requests are granted after `delay` seconds
    with nodes `node<K>` on the job's loopback block's K-th address, numbered after every node
    seen so far (names are never reused within a run, so a released node's logs stay its
    own)."""

    provider = "local"

    def __init__(
        self,
        first_index: int,
        *,
        delay: float | None = None,
        refuse: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        block: LoopbackBlock | None = None,
    ) -> None:
        """`first_index`: the number of the first new node (the allocation's size + 1);
        `block`: the job's loopback block, where the new nodes' addresses are (default 0)."""
        self._block = block if block is not None else LoopbackBlock()
        self._next = first_index
        self._delay = delay if delay is not None else delay_from_env()
        self._refuse = refuse if refuse is not None else os.environ.get(REFUSE_ENV) or None
        self._clock = clock
        self._requests: dict[str, _Simulated] = {}
        self._count = 0

    async def request(self, run: str, count: int) -> str:
        if count < 1:
            raise ValueError("a grow request asks for at least one node")
        if self._refuse:
            raise ProvisionError(self._refuse)
        if self._next + count - 1 > BLOCK_NODES:
            raise ProvisionError(
                f"the job's loopback block {self._block.cidr} has no room for {count} more "
                f"node(s) (a local job has at most {BLOCK_NODES})"
            )
        self._count += 1
        rid = f"{run}-grow-{self._count}"
        nodes = tuple(
            NodeInfo(f"node{k}", self._block.ip(k)) for k in range(self._next, self._next + count)
        )
        self._next += count
        reason = f"Resources (simulated, granted {self._delay:g}s after the request)"
        self._requests[rid] = _Simulated(
            RequestState(rid, count, RequestPhase.PENDING, reason),
            self._clock() + self._delay,
            nodes,
        )
        return rid

    def _refresh(self, sim: _Simulated) -> RequestState:
        if sim.state.phase is RequestPhase.PENDING and self._clock() >= sim.granted_at:
            sim.state = replace(sim.state, phase=RequestPhase.GRANTED, reason="", nodes=sim.names)
        return sim.state

    async def state(self, request_id: str) -> RequestState:
        return self._refresh(self._requests[request_id])

    async def release(self, request_id: str, nodes: Sequence[str]) -> RequestState:
        sim = self._requests[request_id]
        state = self._refresh(sim)
        if state.phase is not RequestPhase.GRANTED:
            return state
        held = tuple(n for n in state.nodes if n.name not in set(nodes))
        phase = RequestPhase.GRANTED if held else RequestPhase.RELEASED
        sim.state = replace(state, nodes=held, phase=phase)
        return sim.state

    async def cancel(self, request_id: str) -> RequestState:
        sim = self._requests[request_id]
        state = self._refresh(sim)
        if state.live:
            sim.state = replace(state, phase=RequestPhase.CANCELLED, nodes=(), reason="")
        return sim.state

    def requests(self) -> list[RequestState]:
        return [self._refresh(sim) for sim in self._requests.values()]

    def restore(self, states: Sequence[RequestState]) -> None:
        """An adopted job's requests (state.json `grow.requests`), as its controller left
        them; one still pending ended with its controller (its simulated wait did)."""
        for state in states:
            if state.phase is RequestPhase.PENDING:
                state = replace(state, phase=RequestPhase.CANCELLED, reason="")
            self._requests[state.id] = _Simulated(state, self._clock(), state.nodes)
            self._count += 1

    async def close(self) -> None:
        for rid in list(self._requests):
            await self.cancel(rid)


def delay_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """`SRTR_LOCAL_PROVISION_DELAY` in seconds (default 2).

    Raises:
        ValueError: not a number of seconds of zero or more.
    """
    text = environ.get(DELAY_ENV)
    if text is None or not text.strip():
        return DEFAULT_DELAY
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{DELAY_ENV} must be a number of seconds; got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{DELAY_ENV} must be a number of seconds of zero or more; got {text!r}")
    return value
