"""The first frame of `srtr up`'s TUI from the plan (`srtr.tui.planned`): what it shows is
what the controller's first state.json will say, and it is on screen before that file
exists."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from srtr.reconciler.clock import FakeClock
from srtr.resources.expand import local_allocation
from srtr.resources.objects import DesiredState
from srtr.resources.planning import plan_text_source
from srtr.store.persist import snapshot
from srtr.store.store import Store
from srtr.tui import planned
from srtr.tui.app import SrtrApp
from srtr.tui.widgets.instances_table import InstancesTable
from srtr.tui.widgets.pools_panel import PoolsPanel
from tests.support.pty_util import PtyProgram
from tests.tui.test_app import SIZE, header_text, until
from tests.tui.test_screens import LEAVE_ALT_SCREEN

RECIPE = textwrap.dedent(
    """\
    name: planned
    services:
      - name: train
        command: ["sleep", "infinity"]
        nodes: 3
        env: {MODE: fast, API_TOKEN: hunter2}
        readiness: {tcp: {port: 9000}}
      - name: watch
        command: ["sleep", "60"]
        placement: {pool: train}
      - name: lone
        command: ["bash", "-c", "sleep 5"]
        nodes: 1
        terminal: true
    """
)


def _desired() -> DesiredState:
    _, desired = plan_text_source(RECIPE, "recipe.yaml", local_allocation(4))
    return desired


def test_the_plan_says_what_the_first_state_json_will_say() -> None:
    desired = _desired()
    store = Store(desired, FakeClock())
    first: dict[str, Any] = dict(snapshot(store, backend="local", controller_pid=1))
    doc = planned.decode(planned.encode(desired, backend="local", slurm_job_id=None))
    # Every field the plan gives is the one the controller's first write has (the rest,
    # its pid, its control socket, is left out, never made up).
    assert {k: first["job"][k] for k in doc["job"]} == doc["job"]
    assert doc["nodes"] == first["nodes"]
    pools = zip(first["pools"], doc["pools"], strict=True)
    assert [{k: theirs[k] for k in mine} for theirs, mine in pools] == doc["pools"]
    assert [i["name"] for i in doc["instances"]] == [i["name"] for i in first["instances"]]
    for mine, theirs in zip(doc["instances"], first["instances"], strict=True):
        assert {k: theirs[k] for k in mine} == mine
    train = next(i for i in doc["instances"] if i["service"] == "train")
    assert train["env"]["API_TOKEN"] != "hunter2"  # masked, as state.json has it
    assert train["probe"]


def test_the_first_frame_shows_the_planned_pools_before_any_state_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # `srtr up` has not even made it yet
    desired = _desired()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job: asyncio.Future[int] = loop.create_future()
        plan: asyncio.Future[int] = loop.create_future()
        app = SrtrApp(run_dir, job=job, plan=plan, check_controller=False)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(InstancesTable)
            assert table.row_count == 0
            fd = os.memfd_create("plan")
            os.write(fd, planned.encode(desired, backend="local", slurm_job_id=None))
            plan.set_result(fd)
            await until(pilot, lambda: table.row_count == len(desired.instances), "the rows")
            pools = str(app.query_one(PoolsPanel).content)
            assert "train 0/3 ready" in pools and "watch 0/3 ready" in pools, pools
            assert "Pending" in header_text(app)
            assert table.selected is not None and table.shown[table.selected].phase == "Pending"
            assert not (run_dir / "state.json").exists()
            job.set_result(0)

    asyncio.run(main())


@pytest.mark.e2e
def test_a_plan_that_fails_under_the_tui_says_why_on_the_terminal_once_it_left(
    tmp_path: Path,
) -> None:
    """The TUI starts as the job plans: a plan that fails (bad input, exit 2) takes it
    away first, and the error is on the terminal it gave back, not behind it."""
    (tmp_path / "r.yaml").write_text(
        'name: bad\nservices:\n  - name: a\n    command: ["sleep", "inf"]\n    nodes: 3\n'
    )
    argv = [sys.executable, "-m", "srtr", "up", "r.yaml", "--nodes", "1"]
    argv += ["--run-dir", str(tmp_path / "run")]
    program = PtyProgram(argv, cwd=tmp_path, env=dict(os.environ), columns=120, lines=30)
    try:
        assert program.wait(60) == 2
    finally:
        program.kill()
    raw = bytes(program.raw)
    left = raw.rfind(LEAVE_ALT_SCREEN)
    assert left >= 0, raw  # the TUI was up, and left
    after = raw[left:].decode(errors="replace")
    assert "r.yaml:5: services[0].nodes:" in after and "Traceback" not in after, after
