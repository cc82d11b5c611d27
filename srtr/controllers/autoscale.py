"""Autoscaled pools (`nodes: {min, max, from}`): one key per pool, `scale/<pool>`.

The pool controller queues the key of a pool the applied recipe autoscales. Every
`interval_seconds`, once the pool's instance 0 is ready, the count it publishes is read
through the prober (off the queue, like a fleet poll) and `resources.autoscale.decide` says
whether the pool changes size. A change is a `Scaling` event (`pool sandbox 4 → 8 (desired
8 from http://…)`) and then a live edit of the pool's size: the recipe controller plans the
file again with the new size (`RecipeStatus.sizes`), so growing past the allocation asks for
nodes and a shrink stops instances by tier and gives provisioned nodes back, as a saved edit
would. state.json's pool says `autoscale`: the bounds, the size, the last published count
and why it could not be read.
"""

from __future__ import annotations

from srtr.controllers.context import RECIPE, Ctx, scale_key
from srtr.reconciler.workqueue import Result
from srtr.resources.autoscale import decide, source_url
from srtr.resources.errors import RecipeError
from srtr.resources.loading import load_text
from srtr.resources.objects import InstanceKind
from srtr.resources.recipe import Autoscale
from srtr.store.status_parts import AutoscaleStatus
from srtr.store.store import Store

READ_TIMEOUT = 5.0  # at most, for one read (less when the interval is shorter)


def autoscaled(store: Store) -> dict[str, Autoscale]:
    """The applied recipe's autoscaled pools (loaded again only when an edit changed it)."""
    recipe = store.recipe
    if recipe.scaled[0] != recipe.text:
        try:
            loaded = load_text(recipe.text, recipe.path)
            scales = {s.name: s.autoscale for s in loaded.services if s.autoscale is not None}
        except RecipeError:  # cannot be: it was applied; then there is nothing to follow
            scales = {}
        recipe.scaled = (recipe.text, scales)
    return recipe.scaled[1]


async def reconcile(ctx: Ctx, pool: str) -> Result | None:
    store = ctx.store
    scale = autoscaled(store).get(pool)
    if scale is None or store.job.teardown_requested:
        return None
    view = _view(store, pool, scale)
    now = ctx.clock.now()
    if view.in_flight:
        return None  # its answer queues the key
    if now < view.due:
        return Result(requeue_after=view.due - now)
    view.due = now + scale.interval_seconds
    ip = _publisher_ip(store, pool)
    if ip is None:
        return Result(requeue_after=scale.interval_seconds)
    view.source = source_url(scale, ip)
    view.in_flight = True
    ctx.spawn(_read(ctx, pool, scale, view))
    return None


def _view(store: Store, pool: str, scale: Autoscale) -> AutoscaleStatus:
    status = store.pool(pool)
    size = store.recipe.sizes.get(pool, len(store.desired.nodes.pools.get(pool, ())))
    view = status.autoscale
    if view is None:
        view = status.autoscale = AutoscaleStatus(scale.min, scale.max, size)
    view.min, view.max, view.size = scale.min, scale.max, size
    return view


def _publisher_ip(store: Store, pool: str) -> str | None:
    """The node IP of the pool's instance 0 once it is ready: only then is the count worth
    reading (before, it is not published yet)."""
    for name, spec in store.specs.items():
        if spec.pool == pool and spec.kind is InstanceKind.OWNER and spec.index == 0:
            status = store.status[name]
            return spec.node_ip if status.alive and status.ready else None
    return None


async def _read(ctx: Ctx, pool: str, scale: Autoscale, view: AutoscaleStatus) -> None:
    where = view.source or ""
    try:
        count, seen = await ctx.prober.published(where, min(READ_TIMEOUT, scale.interval_seconds))
    except Exception as exc:  # a prober bug must not wedge the pool "in flight"
        count, seen = None, f"{where}: read error: {exc!r}"
    view.in_flight = False
    ctx.queue.add(scale_key(pool))
    if not ctx.store.job.teardown_requested:
        _judge(ctx, pool, scale, view, count, seen)


def _judge(
    ctx: Ctx, pool: str, scale: Autoscale, view: AutoscaleStatus, count: int | None, seen: str
) -> None:
    """Record what a read said, and change the pool's size if `decide` says so."""
    store = ctx.store
    if count is None:
        view.read, view.error = True, seen
        if view.failed != seen:  # once per distinct failure, not per read
            view.failed = seen
            store.record(f"pool/{pool}", "ScaleReadFailed", seen, warning=True)
        return
    view.failed = None
    news = view.desired != count or view.error is not None or not view.read
    view.read, view.desired, view.error = True, count, None
    now = ctx.clock.now()
    size = view.size
    decision = decide(scale, size, count, now=now, last_change=view.last_change)
    if decision is None:
        if news:  # state.json shows the new count (written only when something changed)
            store.changed()
        return
    view.last_change = now
    store.recipe.sizes[pool] = view.size = decision.size
    store.record(
        f"pool/{pool}",
        "Scaling",
        f"pool {pool} {size} → {decision.size} (desired {count} from {view.source})",
    )
    store.recipe.replan = True
    ctx.queue.add(RECIPE)
