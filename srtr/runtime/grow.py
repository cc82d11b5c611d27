"""Growing past the allocation (issue 24): grow requests for a live edit, nodes that join,
and nodes that go back once a pool shrank.

A save that needs more nodes than are spare (`errors.GrowRequired`, with the recipe's
`resources.grow: live-edit`) does not apply yet: `Grower.want` asks the backend's
provisioner for the missing nodes, and the pools that need them wait (`pool_pending`: the
provider's word in state.json, `srtr status`, the TUI and events). A later save that needs
no more nodes cancels the request (`settled`). Once granted, the nodes join the backend
(`add_nodes`: a node agent each) and the allocation, and the file's text is planned again:
a normal live edit from there on, in the usual launch order.

After a shrink, provisioned nodes that a carve left spare and nothing runs on any more go
back to their provider (`release`), and leave the allocation; the main allocation's nodes
stay, as spares. At the end of the job every live request is cancelled (`close`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from srtr.backends.base import NodeInfo
from srtr.backends.provision import Provisioner, ProvisionError, RequestPhase, RequestState
from srtr.controllers import edits
from srtr.controllers.context import Ctx
from srtr.resources.carving import releasable
from srtr.resources.errors import GrowRequired

log = logging.getLogger("srtr")

# How often a pending request is looked at, and idle provisioned nodes looked for: cheap,
# for the provider polls its own queue at its own pace (SLURM: one squeue per few seconds,
# sooner once an agent of the request dialled in). A provider that is told its request
# moved (`on_poke`: SLURM, an agent of the request dialled in) wakes the loop at once.
# With no request in flight and no provisioned node, there is nothing to look at: the loop
# sleeps until a save asks for nodes (at 1,024 idle hollow nodes its five wake-ups a second
# were a sixth of the controller's idle CPU).
PERIOD = 0.2


class Growable(Protocol):
    """What a backend does for nodes that a grow request brought."""

    async def add_nodes(self, nodes: Sequence[NodeInfo]) -> None: ...

    async def remove_nodes(self, names: Sequence[str]) -> None: ...


class Allocation:
    """The job's nodes as the live-edit planner sees them: (name, ip) in allocation order,
    and which of them came from a grow request."""

    def __init__(self, nodes: Sequence[tuple[str, str]], provisioned: Sequence[str] = ()) -> None:
        self.nodes = list(nodes)
        self.provisioned: frozenset[str] = frozenset(provisioned)

    def add(self, nodes: Sequence[NodeInfo]) -> None:
        self.nodes += [(n.name, n.ip) for n in nodes]
        self.provisioned |= {n.name for n in nodes}

    def remove(self, names: Sequence[str]) -> None:
        self.nodes = [n for n in self.nodes if n[0] not in set(names)]
        self.provisioned -= set(names)


class Grower:
    """Grow requests of one job. `replan` plans the recipe file's text again (the watcher's
    `check(force=True)`), once nodes joined."""

    def __init__(
        self,
        ctx: Ctx,
        provisioner: Provisioner,
        backend: Growable,
        allocation: Allocation,
        replan: Callable[[], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.provisioner = provisioner
        self.backend = backend
        self.allocation = allocation
        self.replan = replan
        self._wanted: GrowRequired | None = None
        self._request: RequestState | None = None  # the one request in flight
        self._joined: set[str] = set()  # requests whose nodes joined (once each)
        self._nudged = asyncio.Event()
        if hasattr(provisioner, "on_poke"):  # not in the protocol: local one never pokes
            setattr(provisioner, "on_poke", self.poke)  # noqa: B010
        noun = getattr(provisioner, "noun", "request")
        self._noun = str(noun)
        ctx.store.status_views["grow"] = self.view

    def view(self) -> dict[str, object]:
        """state.json's `grow`: every request of the run as last known, for `srtr status`,
        the guard and an adopting controller."""
        return {
            "provider": self.provisioner.provider,
            "provisioned": sorted(self.allocation.provisioned),
            "requests": [r.to_json() for r in self.provisioner.requests()],
        }

    # -- what the recipe watcher tells -----------------------------------------------------

    async def want(self, grow: GrowRequired) -> None:
        """A save needs `grow.missing` more nodes: ask for them (or keep asking)."""
        self._wanted = grow
        current = self._request
        if current is not None and current.live and current.phase is RequestPhase.PENDING:
            if current.count == grow.total:
                self._mark_waiting("GrowPending", current)
                return
            await self._cancel(f"the recipe now needs {grow.total} more node(s)")
        try:
            rid = await self.provisioner.request(self.ctx.store.desired.job_name, grow.total)
        except ProvisionError as exc:
            self._wanted = None
            edits.reject(self.ctx, [*grow.lines(), f"{self.provisioner.provider}: {exc}"])
            return
        self._request = await self.provisioner.state(rid)
        self._mark_waiting("GrowRequested", self._request)
        self.poke()  # a request to follow from now on

    async def settled(self) -> None:
        """A save needs no nodes beyond what the job has: a request in flight is dropped."""
        self._wanted = None
        if self._request is not None and self._request.phase is RequestPhase.PENDING:
            await self._cancel("the recipe no longer needs them")

    # -- the loop --------------------------------------------------------------------------

    def poke(self) -> None:
        """The provider has news of the request in flight: look now, not a PERIOD later."""
        self._nudged.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the request in flight and give idle provisioned nodes back, until `stop`."""
        while not stop.is_set():
            self._nudged.clear()
            try:
                await self._step()
            except Exception:  # a provider's hiccup must not take the job down
                log.exception("following the grow request failed; trying again")
            await self._pause(stop)

    def _following(self) -> bool:
        """Whether there is a request in flight or a provisioned node to look at."""
        request = self._request
        in_flight = request is not None and (
            request.phase is RequestPhase.PENDING
            or (request.phase is RequestPhase.GRANTED and request.id not in self._joined)
        )
        return in_flight or bool(self.allocation.provisioned)

    async def _pause(self, stop: asyncio.Event) -> None:
        """PERIOD (until poked, when there is nothing to follow), or less once `stop` is
        set or the provider poked."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._nudged.wait())]
        timeout = PERIOD if self._following() else None
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def _step(self) -> None:
        request = self._request
        if (
            request is not None
            and request.phase is RequestPhase.GRANTED
            and request.id not in self._joined
        ):
            # Granted inside `want` already (a provider with free nodes at hand).
            await self._join(request)
        elif request is not None and request.phase is RequestPhase.PENDING:
            state = await self.provisioner.state(request.id)
            self._request = state
            if state.phase is RequestPhase.PENDING and state.reason != request.reason:
                self._mark_waiting("GrowPending", state)
            elif state.phase is RequestPhase.GRANTED:
                await self._join(state)
            elif not state.live:
                self._refused(state)
        if not self.ctx.store.job.teardown_requested:
            await self._release_idle()

    async def _join(self, state: RequestState) -> None:
        self._joined.add(state.id)
        nodes = [n for n in state.nodes if n.name not in set(self.allocation.provisioned)]
        names = ", ".join(n.name for n in nodes)
        await self.backend.add_nodes(nodes)
        self.allocation.add(nodes)
        what = f"{len(nodes)} node(s) from {self._where(state)} joined: {names}"
        self.ctx.store.pools_waiting({}, "NodesJoined", what)
        self._wanted = None
        await self.replan()

    def _refused(self, state: RequestState) -> None:
        grow, self._wanted = self._wanted, None
        self.ctx.store.pool_pending = {}
        why = state.reason or f"it ended ({state.phase})"
        lines = grow.lines() if grow is not None else []
        edits.reject(self.ctx, [*lines, f"{self._where(state)} was refused: {why}"])

    async def _cancel(self, why: str) -> None:
        request = self._request
        assert request is not None
        self._request = await self.provisioner.cancel(request.id)
        self.ctx.store.pools_waiting({}, "GrowCancelled", f"{self._where(request)}: {why}")

    async def _release_idle(self) -> None:
        store = self.ctx.store
        idle = set(releasable(store.desired.nodes, self.allocation.provisioned))
        if not idle:
            return
        busy = {store.specs[n].node for n, st in store.status.items() if st.alive}
        idle -= busy
        for request in self.provisioner.requests():
            names = [n.name for n in request.nodes if n.name in idle]
            if not names or request.phase is not RequestPhase.GRANTED:
                continue
            await self.backend.remove_nodes(names)
            after = await self.provisioner.release(request.id, names)
            if self._request is not None and self._request.id == request.id:
                self._request = after
            self.allocation.remove(names)
            where = f"{self.provisioner.provider} ({self._noun} {request.id})"
            store.nodes_released(names, f"gave {', '.join(names)} back to {where}")

    # -- helpers ---------------------------------------------------------------------------

    def _where(self, state: RequestState) -> str:
        return f"{self.provisioner.provider} {self._noun} {state.id}"

    def _mark_waiting(self, reason: str, state: RequestState) -> None:
        grow = self._wanted
        missing = grow.missing if grow is not None else {}
        why = state.reason or "pending"
        reasons = {
            pool: f"waiting for {count} node(s) from {self.provisioner.provider} "
            f"({self._noun} {state.id}: {why})"
            for pool, count in missing.items()
        }
        self.ctx.store.pools_waiting(
            reasons, reason, "; ".join(f"pool {p} {r}" for p, r in reasons.items())
        )

    async def close(self) -> None:
        """The job ended: every live request is cancelled, its nodes go back."""
        await self.provisioner.close()
