"""Live edits: plan the recipe file's latest saved text, and apply it or hold it. Key `recipe`.

The recipe watcher (`runtime.recipe_watch`) only records each save's text in the store
(`RecipeStatus.saved`, or why it could not be read) and queues this key. The reconcile loads
and validates the text like `srtr plan`, expands it against the running job's node map
(running instances never move) with the autoscaled pools' sizes, diffs it, and hands the
plan to `edits.propose`. A text that cannot be planned, whatever the reason (a
RecursionError from deeply nested YAML included), is a `RecipeRejected` event with
`file:line: message` and touches nothing; the next good save applies.

A save that needs more nodes than are spare goes to the `grow` controller when the job can
grow. A service the edit adds with a `source` is pinned first, off the queue (`git
ls-remote` may take its time), and the text planned again with its pin.
"""

from __future__ import annotations

import asyncio
import logging

from srtr.controllers import edits, grow
from srtr.controllers.context import RECIPE, Ctx
from srtr.net import git_refs
from srtr.reconciler.workqueue import Result
from srtr.resources.diff import diff
from srtr.resources.errors import GrowRequired, Problem, RecipeError
from srtr.resources.objects import DesiredState
from srtr.resources.pins import PINS_FILE, unpinned
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Service

log = logging.getLogger("srtr")


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    recipe = store.recipe
    if recipe.unreadable is not None:
        lines, recipe.unreadable = recipe.unreadable, None
        edits.reject(ctx, lines)
        return None
    text = recipe.saved if recipe.saved is not None else recipe.text
    if text == recipe.planned and not recipe.replan:
        return None
    recipe.planned, recipe.replan = text, False
    try:
        new = _plan(ctx, text)
    except GrowRequired as exc:
        if not store.grow.enabled:
            edits.reject(ctx, [*exc.lines(), *([recipe.no_grow] if recipe.no_grow else [])])
        else:
            await grow.want(ctx, exc)
        return None
    except RecipeError as exc:
        edits.reject(ctx, exc.lines())
        return None
    except Exception as exc:
        edits.reject(ctx, [Problem((), _unplannable(exc), line=1).format(recipe.path)])
        return None
    if new is None:
        return None  # its new sources are being pinned; that queues the key again
    if store.grow.enabled:
        await grow.settled(ctx)
    for warning in new.line_warnings:  # placeholder typos: warned, never refused
        store.record("job", "PlanWarning", warning, warning=True)
    launched = frozenset(n for n, st in store.status.items() if st.attempt >= 0)
    plan = diff(store.desired, new, launched=launched)
    edits.propose(ctx, new, plan, text, auto=recipe.auto)
    return None


def _unplannable(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "the recipe nests too deeply to be read"
    return f"the recipe cannot be planned: {type(exc).__name__}: {exc}"


def _plan(ctx: Ctx, text: str) -> DesiredState | None:
    """Plan `text` with the job's pins; None while the sources of services the edit adds are
    being pinned (they then join the job's pins).

    Raises:
        RecipeError: the recipe is invalid.
    """
    store = ctx.store
    recipe, new = plan_text_source(
        text,
        store.recipe.path,
        store.grow.nodes,
        store.desired.nodes,
        pins=ctx.source_pins,
        provisioned=store.grow.provisioned,
        sizes=store.recipe.sizes,
    )
    # Only services new to the job: another rev of one it runs keeps the job's pin out of
    # its plan (its clone step differs, and the edit is refused while it runs).
    running = {spec.service for spec in store.desired.instances}
    missing = [(i, s) for i, s in unpinned(recipe, ctx.source_pins) if s.name not in running]
    if not missing:
        return new
    if not store.recipe.pinning:
        store.recipe.pinning = True
        ctx.spawn(_pin(ctx, missing, text))
    return None


async def _pin(ctx: Ctx, missing: list[tuple[int, Service]], text: str) -> None:
    """Resolve the new sources' revs (off the queue), then plan the text again."""
    recipe = ctx.store.recipe
    try:
        found = await asyncio.to_thread(git_refs.pin_services, missing, text, recipe.path)
    except RecipeError as exc:
        edits.reject(ctx, exc.lines())
        return
    finally:
        recipe.pinning = False
    ctx.source_pins = {**ctx.source_pins, **found}
    try:
        await asyncio.to_thread(git_refs.save_pins, ctx.run_dir, ctx.source_pins)
    except OSError as exc:  # kept in memory; an adoption would plan it unpinned
        log.warning("cannot record the new source pins in %s: %s", PINS_FILE, exc)
    recipe.replan = True
    ctx.queue.add(RECIPE)
