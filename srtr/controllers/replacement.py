"""Replace lost nodes: a pool whose owner declares `replace_lost: true` takes a spare node.

When an owner instance is Lost (its node went DOWN) and the allocation has a spare, the
spare takes the lost node's place in the pool: the desired state is re-expanded from the
applied recipe with that one node swapped, and the resulting plan is applied like a live
edit (the owner and its riders start on the spare; the lost instances are dropped). The lost
node is left out of the allocation from then on.

A node cut off from the controller (a partition) may still run the lost instances: its agent
stops them itself once its lease runs out and their grace passes, and the backend says by
when (`Observation.extra["fenced_in"]`, noted by `note_lost`). The spare waits until then,
so that no instance ever runs twice.
"""

from __future__ import annotations

from dataclasses import replace

from srtr.backends.base import Observation
from srtr.controllers import edits
from srtr.controllers.context import Ctx
from srtr.reconciler.workqueue import Result
from srtr.resources.diff import diff
from srtr.resources.errors import RecipeError
from srtr.resources.planning import plan_text_source
from srtr.store.store import Phase

KEY = "replacement"


def note_lost(ctx: Ctx, obs: Observation) -> None:
    """Remember until when `obs`'s lost instance may still run on its cut-off node."""
    fenced_in = obs.extra.get("fenced_in")
    if fenced_in is not None:
        ctx.store.fences.until[obs.name] = ctx.clock.now() + float(fenced_in)


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    if store.job.teardown_requested or not store.recipe_text:
        return None
    lost = [
        n
        for n, st in store.status.items()
        if st.phase is Phase.LOST
        and store.specs[n].replace_lost
        and n in store.desired_names
        and store.specs[n].pool
    ]
    wait = _fenced(ctx, lost)
    if wait is not None:
        return Result(requeue_after=wait)
    for name in lost:
        if not _replace(ctx, name):
            return None
    return None


def _fenced(ctx: Ctx, lost: list[str]) -> float | None:
    """How long until the last fence of `lost` ends (None: none holds); each wait is told
    once. Its node's agent may still run it: the spare starts once it stopped them."""
    store, now = ctx.store, ctx.clock.now()
    fences = store.fences
    held = [n for n in lost if fences.until.get(n, now) > now]
    if not held:
        return None
    for name in held:
        if name not in fences.told:
            fences.told.add(name)
            spec = store.specs[name]
            store.record(
                f"pool/{spec.pool}",
                "Fencing",
                f"{spec.node} was lost; a spare takes its place in "
                f"{fences.until[name] - now:.1f}s, once its agent has stopped its instances "
                "(its lease and their grace)",
            )
    return min(fences.until[n] - now for n in held)


def _replace(ctx: Ctx, name: str) -> bool:
    """A spare takes lost `name`'s node in its pool; False when none can (recorded)."""
    store = ctx.store
    spec = store.specs[name]
    nodes = store.desired.nodes
    if not nodes.spares:
        store.record(
            f"pool/{spec.pool}",
            "NoSpare",
            f"{spec.node} was lost and no spare node is left",
            warning=True,
        )
        return False
    spare = nodes.spares[0]
    assert spec.pool is not None
    pools = dict(nodes.pools)
    pools[spec.pool] = tuple(spare if n == spec.node else n for n in pools[spec.pool])
    allocation = [(n.name, n.ip) for n in nodes.allocation]
    previous = replace(nodes, pools=pools, spares=nodes.spares[1:], lost=(*nodes.lost, spec.node))
    try:
        _, new = plan_text_source(
            store.recipe_text, "recipe.yaml", allocation, previous, pins=ctx.source_pins
        )
    except RecipeError as exc:
        store.record(
            f"pool/{spec.pool}",
            "NoSpare",
            f"cannot replace {spec.node}: {'; '.join(exc.lines())}",
            warning=True,
        )
        return False
    plan = diff(
        store.desired,
        new,
        launched=frozenset(n for n, st in store.status.items() if st.attempt >= 0),
    )
    store.record(
        f"pool/{spec.pool}", "Replaced", f"{spec.node} was lost; spare {spare} takes its place"
    )
    edits.apply(ctx, new, plan, store.recipe_text)
    return True
