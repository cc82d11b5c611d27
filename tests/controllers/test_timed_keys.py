"""Timed decisions and live edits as keys of the one work queue: `recipe` (a save of the
recipe file), `walltime` (the allocation's end) and `scale/<pool>` (an autoscaled pool),
driven with the controller harness (fake backend, fake clock, scripted prober)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from srtr.backends.base import Capabilities
from srtr.controllers import walltime
from srtr.controllers.context import RECIPE, pool_key
from srtr.resources.expand import local_allocation
from srtr.store.persist import snapshot
from tests.support.controller_harness import Harness

SIMPLE = """
name: t
services:
  - name: app
    command: [sleep, inf]
    nodes: {nodes}
"""


def watched(recipe: str, tmp_path: Path, nodes: int = 4) -> Harness:
    """A harness whose job follows saves of its recipe, as `RecipeWatch` sets it up."""
    h = Harness(recipe, tmp_path, nodes)
    h.store.recipe_text = textwrap.dedent(recipe)
    h.store.recipe.planned = h.store.recipe_text
    h.store.grow.nodes = local_allocation(nodes)
    return h


def save(h: Harness, text: str) -> None:
    """What the recipe watcher does on a save: record the text, queue the key."""
    h.store.recipe_saved(textwrap.dedent(text))
    h.ctx.queue.add(RECIPE)


def test_deeply_nested_yaml_is_a_rejected_edit_and_a_later_good_one_applies(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        h = watched(SIMPLE.format(nodes=1), tmp_path)
        await h.settle()
        before = dict(h.store.specs)
        nested = "name: t\nservices: " + "[" * 5000 + "]" * 5000 + "\n"
        save(h, nested)
        await h.settle()
        [rejected] = [e for e in h.events if e.reason == "RecipeRejected"]
        assert rejected.message.startswith("recipe.yaml:1: ")
        assert "nests too deeply" in rejected.message
        assert h.store.specs == before and h.store.job.generation == 1
        doc = snapshot(h.store, backend="fake", controller_pid=1)
        assert doc["recipe"]["rejected"] == [rejected.message]
        save(h, SIMPLE.format(nodes=2))  # the watcher kept going: a good edit applies
        await h.settle()
        assert "RecipeApplied" in h.reasons("job")
        assert h.store.job.generation == 2 and h.phase("service_app_node2") == "Running"

    asyncio.run(body())


def test_an_unreadable_save_is_rejected_and_the_same_text_again_changes_nothing(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        h = watched(SIMPLE.format(nodes=1), tmp_path)
        await h.settle()
        h.store.recipe_unreadable(["recipe.yaml: the recipe is larger than 4 MiB"])
        h.ctx.queue.add(RECIPE)
        await h.settle()
        assert h.reasons("job").count("RecipeRejected") == 1
        seen = list(h.events)
        save(h, SIMPLE.format(nodes=1))  # the text last planned: nothing to plan again
        await h.settle()
        assert h.events == seen and h.store.job.generation == 1

    asyncio.run(body())


def test_walltime_key_waits_for_the_budget_then_tears_down(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(SIMPLE.format(nodes=1), tmp_path)
        h.backend.capabilities = Capabilities(walltime=True)
        budget = walltime.teardown_budget(h.store.desired) + walltime.WALLTIME_MARGIN
        h.backend.walltime_end = h.clock.wall() + budget + 100
        h.ctx.queue.add(walltime.KEY)
        await h.settle()
        assert "Walltime" in h.reasons("job") and not h.store.job.teardown_requested
        doc = snapshot(h.store, backend="fake", controller_pid=1)
        assert doc["job"]["end_time"] == h.backend.walltime_end
        await h.advance(99)
        assert not h.store.job.teardown_requested
        await h.advance(1)
        assert h.store.job.teardown_requested and "walltime" in h.store.job.reason

    asyncio.run(body())


SCALED = """
name: scaled
services:
  - name: fleet
    command: [sleep, inf]
    nodes: {{min: 1, max: 3, from: {{file: {want}}}, interval_seconds: 5, cooldown_seconds: 0}}
"""


def test_scale_key_reads_the_published_count_and_resizes_the_pool(tmp_path: Path) -> None:
    async def body() -> None:
        want = str(tmp_path / "want")
        h = watched(SCALED.format(want=want), tmp_path)
        h.prober.published_answers[want] = 2
        h.ctx.queue.add(pool_key("fleet"))
        await h.settle()
        assert h.prober.published_reads == [want]
        assert [e.message for e in h.events if e.reason == "Scaling"] == [
            f"pool fleet 1 → 2 (desired 2 from {want})"
        ]
        assert h.store.job.generation == 2 and h.phase("service_fleet_node2") == "Running"
        pool = snapshot(h.store, backend="fake", controller_pid=1)["pools"][0]
        assert pool["autoscale"] == {
            "min": 1,
            "max": 3,
            "size": 2,
            "source": want,
            "desired": 2,
            "error": None,
        }
        await h.advance(5)  # the next read, one interval later; nothing new to do
        assert len(h.prober.published_reads) == 2 and h.store.job.generation == 2
        del h.prober.published_answers[want]
        await h.advance(5)
        pool = snapshot(h.store, backend="fake", controller_pid=1)["pools"][0]
        assert pool["autoscale"]["error"] == f"{want}: nothing published"
        assert h.reasons("pool/fleet").count("ScaleReadFailed") == 1

    asyncio.run(body())
