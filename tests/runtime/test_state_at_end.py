"""state.json at the job's end: written as soon as the job is over and the agents were told
to end (while they say goodbye), whole; the side task's stop writes again only what changed
since. And `manager`'s close runs the closing hooks after its first step, before its end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from srtr.controllers import manager
from srtr.controllers.context import Ctx
from srtr.reconciler.clock import FakeClock
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from srtr.runtime.side_tasks import StateFile
from srtr.store.state_log import DELTA_FILE, StateWriter
from srtr.store.store import Store


def test_the_end_is_written_at_once_and_stop_adds_nothing(tmp_path: Path) -> None:
    recipe = "name: t\nservices:\n  - name: s\n    command: [sleep, inf]\n"
    _, desired = plan_text_source(recipe, "recipe.yaml", local_allocation(1))
    store = Store(desired, FakeClock())
    backend = SimpleNamespace(name="local", owns_allocation=False)
    hooks: list[Callable[[], None]] = []  # `Ctx.when_closing`'s, run by hand below
    ctx = cast(
        Any,
        SimpleNamespace(store=store, run_dir=tmp_path, backend=backend, when_closing=hooks.append),
    )
    options = SimpleNamespace(slurm_job_id=None, recipe=None, launcher=None, network=None)
    state = StateFile(ctx, cast(Any, options))
    state.writer = StateWriter(tmp_path, limit=200)  # a big job's: snapshot and delta log
    path = tmp_path / "state.json"

    async def body() -> None:
        await state.start()
        state.write()
        store.begin_teardown(exit_code=0, reason="stopped")
        store.job_finished()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        # Not before the agents are told to end: it would delay their goodbyes.
        assert json.loads(path.read_text())["job"]["phase"] != "Succeeded"
        assert len(hooks) == 1
        hooks[0]()
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # one turn: no waiting out the write period
        assert json.loads(path.read_text())["job"]["phase"] == "Succeeded"
        assert not (tmp_path / DELTA_FILE).exists()  # whole: the snapshot, no log
        written = path.stat().st_mtime_ns, path.read_bytes()
        await state.stop()
        assert (path.stat().st_mtime_ns, path.read_bytes()) == written  # nothing changed

    asyncio.run(body())


def test_the_closing_hooks_run_once_the_agents_are_told_to_end() -> None:
    seen: list[str] = []

    class Backend:
        async def close(self) -> None:
            seen.append("told")  # the agents' Shutdown goes out in the first step
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            seen.append("closed")

    # A real Ctx's hooks: one registered before the close, one after it began (run at once).
    fake = SimpleNamespace(backend=Backend(), on_closing=[], closing=False)
    fake.when_closing = lambda hook: Ctx.when_closing(cast(Ctx, fake), hook)
    fake.began_closing = lambda: Ctx.began_closing(cast(Ctx, fake))
    fake.when_closing(lambda: seen.append("hook"))

    async def run() -> None:
        await manager._close(cast(Ctx, fake))
        fake.when_closing(lambda: seen.append("late"))

    asyncio.run(run())
    assert seen == ["told", "hook", "closed", "late"]
