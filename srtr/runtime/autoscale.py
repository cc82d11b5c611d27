"""Autoscaled pools (`nodes: {min, max, from}`, issue 24): the controller's loop.

Every `interval_seconds` per pool, once the pool's instance 0 is ready, the count it
publishes is read (`backends.published`) and `resources.autoscale.decide` says whether the
pool changes size. A change is a `Scaling` event (`pool sandbox 4 → 8 (desired 8 from
http://…)`) and then a live edit of the pool's size: the recipe watcher plans the file again
with the new size (`RecipeWatcher.sizes`), so growing past the allocation asks for nodes and
a shrink stops instances by tier and gives provisioned nodes back, as a saved edit would.
state.json's pool says `autoscale`: the bounds, the size, the last published count and why
it could not be read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from srtr.backends.published import read_count
from srtr.controllers.context import Ctx
from srtr.resources.autoscale import decide, source_url
from srtr.resources.errors import RecipeError
from srtr.resources.loading import load_text
from srtr.resources.objects import InstanceKind
from srtr.resources.recipe import Autoscale, Recipe
from srtr.runtime.recipe_watch import RecipeWatcher

log = logging.getLogger("srtr")

TICK = 0.25  # how finely the per-pool intervals are kept
# With no pool autoscaled, only a save that adds one can change that: looked for once a
# second, not four times (each look a wake-up of an idle controller).
IDLE_TICK = 1.0
READ_TIMEOUT = 5.0  # at most, for one read (less when the interval is shorter)


class Autoscaler:
    """Follows every autoscaled pool of the job in `ctx`; scales through `watcher`."""

    def __init__(self, ctx: Ctx, watcher: RecipeWatcher) -> None:
        self.ctx = ctx
        self.watcher = watcher
        self._recipe: tuple[str, Recipe | None] = ("", None)
        self._due: dict[str, float] = {}
        self._last_change: dict[str, float] = {}
        self._failed: dict[str, str] = {}  # pool → the read failure last reported
        # state.json's pools[].autoscale (`persist`): per pool, the bounds, size and the
        # last published count.
        self._views: dict[str, dict[str, Any]] = ctx.store.extensions.setdefault("autoscale", {})

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            following = True
            try:
                following = await self._tick()
            except Exception:  # a publisher's nonsense must not take the job down
                log.exception("autoscaling failed; trying again")
            try:
                async with asyncio.timeout(TICK if following else IDLE_TICK):
                    await stop.wait()
            except TimeoutError:
                pass

    def _applied(self) -> Recipe | None:
        """The recipe that runs (planned again only when an edit changed its text)."""
        text = self.ctx.store.recipe_text
        if text != self._recipe[0]:
            try:
                recipe: Recipe | None = load_text(text, str(self.watcher.path))
            except RecipeError:  # cannot be: it was applied; then there is nothing to follow
                recipe = None
            self._recipe = (text, recipe)
        return self._recipe[1]

    async def _tick(self) -> bool:
        """Follow every pool that is due; whether any pool is autoscaled."""
        store = self.ctx.store
        if store.job.teardown_requested:
            return False
        recipe = self._applied()
        if recipe is None:
            return False
        now = self.ctx.clock.now()
        following = False
        for service in recipe.services:
            scale = service.autoscale
            if scale is None:
                continue
            following = True
            if now < self._due.get(service.name, 0.0):
                continue
            self._due[service.name] = now + scale.interval_seconds
            await self._follow(service.name, scale)
        return following

    def _publisher_ip(self, pool: str) -> str | None:
        """The node IP of the pool's instance 0 once it is ready: only then is the count
        worth reading (before, it is not published yet)."""
        store = self.ctx.store
        for name, spec in store.specs.items():
            if spec.pool == pool and spec.kind is InstanceKind.OWNER and spec.index == 0:
                status = store.status[name]
                return spec.node_ip if status.alive and status.ready else None
        return None

    async def _follow(self, pool: str, scale: Autoscale) -> None:
        store = self.ctx.store
        size = self.watcher.sizes.get(pool, len(store.desired.nodes.pools.get(pool, ())))
        view = self._views.setdefault(pool, {})
        view.update(min=scale.min, max=scale.max, size=size)
        ip = self._publisher_ip(pool)
        if ip is None:
            return
        where = source_url(scale, ip)
        view["source"] = where
        count, seen = await read_count(where, min(READ_TIMEOUT, scale.interval_seconds))
        if count is None:
            view["error"] = seen
            if self._failed.get(pool) != seen:  # once per distinct failure, not per read
                self._failed[pool] = seen
                store.record(f"pool/{pool}", "ScaleReadFailed", seen, warning=True)
            return
        self._failed.pop(pool, None)
        news = view.get("desired") != count or view.get("error") is not None
        view.update(desired=count, error=None)
        now = self.ctx.clock.now()
        decision = decide(scale, size, count, now=now, last_change=self._last_change.get(pool))
        if decision is None:
            if news:  # state.json shows the new count (written only when something changed)
                store.changed()
            return
        self._last_change[pool] = now
        self.watcher.sizes[pool] = decision.size
        view["size"] = decision.size
        store.record(
            f"pool/{pool}",
            "Scaling",
            f"pool {pool} {size} → {decision.size} (desired {count} from {where})",
        )
        await self.watcher.check(force=True)
