"""Growing past the allocation: grow requests for a live edit, nodes that join, and nodes
that go back once a pool shrank. One key, `grow`.

A save that needs more nodes than are spare (`errors.GrowRequired`, with the recipe's
`resources.grow: live-edit`) does not apply yet: `want` (called by the recipe controller)
asks the provisioner for the missing nodes, and the pools that need them wait
(`PoolStatus.pending`: the provider's word in state.json, `srtr status`, the TUI and events).
A later save that needs no more nodes cancels the request (`settled`). Once granted, the
nodes join the backend (`add_nodes`: a node agent each) and the allocation, and the file's
text is planned again (the `recipe` key): a normal live edit from there on.

After a shrink, provisioned nodes that a carve left spare and nothing runs on any more go
back to their provider, and leave the allocation; the main allocation's nodes stay, as
spares. The reconcile looks every `PERIOD` while a request is in flight or a provisioned
node is held; a provider that hears of its request (SLURM: an agent of it dialled in)
enqueues the key at once (`on_poke`). With nothing to follow, nothing is queued.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, cast

from srtr.backends.base import NodeInfo
from srtr.backends.provision import Provisioner, ProvisionError, RequestPhase, RequestState
from srtr.controllers import edits
from srtr.controllers.context import GROW, RECIPE, Ctx
from srtr.reconciler.workqueue import Result
from srtr.resources.carving import releasable
from srtr.resources.errors import GrowRequired

log = logging.getLogger("srtr")

# How often a pending request is looked at, and idle provisioned nodes looked for: cheap,
# for the provider polls its own queue at its own pace.
PERIOD = 0.2


class Growable(Protocol):
    """What a backend does for nodes that a grow request brought."""

    async def add_nodes(self, nodes: Sequence[NodeInfo]) -> None: ...

    async def remove_nodes(self, names: Sequence[str]) -> None: ...


def setup(ctx: Ctx, provisioner: Provisioner) -> None:
    """The job can grow through `provisioner`: state.json says so from now on, and the
    provider's news of a request queues the `grow` key."""
    ctx.provisioner = provisioner
    grow = ctx.store.grow
    grow.enabled, grow.provider = True, provisioner.provider
    grow.noun = str(getattr(provisioner, "noun", "request"))
    grow.requests = provisioner.requests()
    if hasattr(provisioner, "on_poke"):  # not in the protocol: the local one never pokes
        setattr(provisioner, "on_poke", lambda: ctx.queue.add(GROW))  # noqa: B010
    ctx.queue.add(GROW)  # provisioned nodes an adopted run holds are followed


def _provisioner(ctx: Ctx) -> Provisioner:
    assert ctx.provisioner is not None
    return ctx.provisioner


def _current(ctx: Ctx) -> RequestState | None:
    """The request in flight, as its provider last described it."""
    rid = ctx.store.grow.request
    return next((r for r in _provisioner(ctx).requests() if r.id == rid), None)


def _seen(ctx: Ctx, state: RequestState) -> RequestState:
    ctx.store.grow.request, ctx.store.grow.reason = state.id, state.reason
    return state


async def want(ctx: Ctx, grow: GrowRequired) -> None:
    """A save needs `grow.missing` more nodes: ask for them (or keep asking)."""
    status, provisioner = ctx.store.grow, _provisioner(ctx)
    status.wanted = grow
    current = _current(ctx)
    if current is not None and current.live and current.phase is RequestPhase.PENDING:
        if current.count == grow.total:
            _mark_waiting(ctx, "GrowPending", current)
            return
        await _cancel(ctx, f"the recipe now needs {grow.total} more node(s)")
    try:
        rid = await provisioner.request(ctx.store.desired.job_name, grow.total)
    except ProvisionError as exc:
        status.wanted = None
        edits.reject(ctx, [*grow.lines(), f"{provisioner.provider}: {exc}"])
        return
    _mark_waiting(ctx, "GrowRequested", _seen(ctx, await provisioner.state(rid)))
    ctx.queue.add(GROW)  # a request to follow from now on


async def settled(ctx: Ctx) -> None:
    """A save needs no nodes beyond what the job has: a request in flight is dropped."""
    ctx.store.grow.wanted = None
    current = _current(ctx)
    if current is not None and current.phase is RequestPhase.PENDING:
        await _cancel(ctx, "the recipe no longer needs them")


async def reconcile(ctx: Ctx) -> Result | None:
    """Follow the request in flight and give idle provisioned nodes back."""
    if ctx.provisioner is None:
        return None
    grow = ctx.store.grow
    request = _current(ctx)
    if request is not None and request.phase is RequestPhase.GRANTED:
        if request.id not in grow.joined:  # granted inside `want` already
            await _join(ctx, request)
    elif request is not None and request.phase is RequestPhase.PENDING:
        told = grow.reason
        state = _seen(ctx, await ctx.provisioner.state(request.id))
        if state.phase is RequestPhase.PENDING and state.reason != told:
            _mark_waiting(ctx, "GrowPending", state)
        elif state.phase is RequestPhase.GRANTED:
            await _join(ctx, state)
        elif not state.live:
            _refused(ctx, state)
    if not ctx.store.job.teardown_requested:
        await _release_idle(ctx)
    _refresh(ctx)
    return Result(requeue_after=PERIOD) if _following(ctx) else None


def _following(ctx: Ctx) -> bool:
    """Whether there is a request in flight or a provisioned node to look at."""
    grow, request = ctx.store.grow, _current(ctx)
    in_flight = request is not None and (
        request.phase is RequestPhase.PENDING
        or (request.phase is RequestPhase.GRANTED and request.id not in grow.joined)
    )
    return in_flight or bool(grow.provisioned)


def _refresh(ctx: Ctx) -> None:
    """state.json's `grow.requests`: the provider's word as of now."""
    ctx.store.grow.requests = _provisioner(ctx).requests()


async def _join(ctx: Ctx, state: RequestState) -> None:
    """The request was granted: its nodes join, off the queue (an agent each may take its
    time to connect, and the job's other keys must not wait for it)."""
    grow = ctx.store.grow
    grow.joined.add(state.id)
    nodes = [n for n in state.nodes if n.name not in grow.provisioned]
    ctx.spawn(_add(ctx, state, nodes))


async def _add(ctx: Ctx, state: RequestState, nodes: list[NodeInfo]) -> None:
    try:
        await cast(Growable, ctx.backend).add_nodes(nodes)
    except Exception:  # a backend's hiccup must not take the job down; the nodes stay out
        log.exception("the nodes of %s could not join", _where(ctx, state))
        return
    grow = ctx.store.grow
    grow.add([(n.name, n.ip) for n in nodes])
    names = ", ".join(n.name for n in nodes)
    what = f"{len(nodes)} node(s) from {_where(ctx, state)} joined: {names}"
    ctx.store.pools_waiting({}, "NodesJoined", what)
    grow.wanted = None
    ctx.store.recipe.replan = True  # the file's text is planned again, on the new nodes
    ctx.queue.add(RECIPE)
    ctx.queue.add(GROW)  # provisioned nodes to look after from now on


def _refused(ctx: Ctx, state: RequestState) -> None:
    grow = ctx.store.grow
    wanted, grow.wanted = grow.wanted, None
    for pool in ctx.store.pools.values():
        pool.pending = None
    why = state.reason or f"it ended ({state.phase})"
    lines = wanted.lines() if wanted is not None else []
    edits.reject(ctx, [*lines, f"{_where(ctx, state)} was refused: {why}"])


async def _cancel(ctx: Ctx, why: str) -> None:
    request = _current(ctx)
    assert request is not None
    _seen(ctx, await _provisioner(ctx).cancel(request.id))
    ctx.store.pools_waiting({}, "GrowCancelled", f"{_where(ctx, request)}: {why}")
    _refresh(ctx)


async def _release_idle(ctx: Ctx) -> None:
    store, provisioner = ctx.store, _provisioner(ctx)
    grow = store.grow
    idle = set(releasable(store.desired.nodes, grow.provisioned))
    if not idle:
        return
    busy = {store.specs[n].node for n, st in store.status.items() if st.alive}
    idle -= busy
    for request in provisioner.requests():
        names = [n.name for n in request.nodes if n.name in idle]
        if not names or request.phase is not RequestPhase.GRANTED:
            continue
        await cast(Growable, ctx.backend).remove_nodes(names)
        after = await provisioner.release(request.id, names)
        if grow.request == request.id:
            _seen(ctx, after)
        grow.remove(names)
        where = f"{provisioner.provider} ({grow.noun} {request.id})"
        store.nodes_released(names, f"gave {', '.join(names)} back to {where}")


def _where(ctx: Ctx, state: RequestState) -> str:
    return f"{ctx.store.grow.provider} {ctx.store.grow.noun} {state.id}"


def _mark_waiting(ctx: Ctx, reason: str, state: RequestState) -> None:
    grow = ctx.store.grow
    missing = grow.wanted.missing if grow.wanted is not None else {}
    why = state.reason or "pending"
    reasons = {
        pool: f"waiting for {count} node(s) from {grow.provider} ({grow.noun} {state.id}: {why})"
        for pool, count in missing.items()
    }
    _refresh(ctx)
    ctx.store.pools_waiting(reasons, reason, "; ".join(f"pool {p} {r}" for p, r in reasons.items()))
