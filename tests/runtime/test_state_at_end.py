"""state.json at the job's end: written as soon as the job is over (while the agents say
goodbye), whole; the side task's stop writes again only what changed since."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

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
    ctx = cast(Any, SimpleNamespace(store=store, run_dir=tmp_path, backend=backend))
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
        await asyncio.sleep(0)  # one turn: no waiting out the write period
        assert json.loads(path.read_text())["job"]["phase"] == "Succeeded"
        assert not (tmp_path / DELTA_FILE).exists()  # whole: the snapshot, no log
        written = path.stat().st_mtime_ns, path.read_bytes()
        await state.stop()
        assert (path.stat().st_mtime_ns, path.read_bytes()) == written  # nothing changed

    asyncio.run(body())
