"""`srtr up --adopt` of a big job: its state is the snapshot with the delta log applied,
read through the one reader, so what the crashed controller last wrote is what is adopted."""

from __future__ import annotations

from pathlib import Path

from srtr.controllers.context import Ctx
from srtr.reconciler.clock import FakeClock
from srtr.reconciler.workqueue import WorkQueue
from srtr.runtime import adoption
from srtr.store.rundir import read_state
from srtr.store.store import Store
from tests.support.big_state import big_run_dir
from tests.support.controller_harness import FakeProber


def test_adoption_restores_a_big_job_from_its_snapshot_and_deltas(tmp_path: Path) -> None:
    h = big_run_dir(tmp_path)
    clock = FakeClock()
    store = Store(h.store.desired, clock)
    ctx = Ctx(
        store=store,
        backend=h.backend,
        clock=clock,
        queue=WorkQueue(clock),
        prober=FakeProber(),
        run_dir=tmp_path,
    )
    to_adopt = adoption.restore(ctx, read_state(tmp_path))
    web = store.status["service_web"]
    assert (str(web.phase), web.exit_code, web.attempt) == ("BackOff", 3, 0)  # from a delta
    assert {name for name, _ in to_adopt} == {n for n in h.store.specs if n != "service_web"}
    assert all(record["identity"] == h.store.status[n].identity for n, record in to_adopt)
