"""`srtr status` of a big job: a summary from summary.json (pools, counts, what is not as
desired) instead of a row per instance, unless asked for every instance (`--all`, `-o json`).

The run dir is synthetic: a store driven by the fake backend, written by the state writer in
its big-job mode, as a controller would have left it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from srtr.controllers.context import Ctx
from srtr.reconciler.clock import FakeClock
from srtr.reconciler.workqueue import WorkQueue
from srtr.runtime import adoption
from srtr.store.persist import head, snapshot
from srtr.store.rundir import read_state
from srtr.store.state_log import StateWriter
from srtr.store.store import Store
from tests.support.controller_harness import FakeProber, Harness

JOB = """
name: big
services:
  - name: train
    command: [train]
    nodes: 3
  - name: shipper
    command: [ship]
    placement: {pool: train}
  - name: web
    command: [serve]
    restart: {policy: always, backoff_seconds: 50}
"""


def _big_run_dir(tmp_path: Path) -> Harness:
    async def body() -> Harness:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1)
        await h.settle()
        writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)
        h.exit("service_web", 3)
        await h.settle()
        writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)
        return h

    return asyncio.run(body())


def _status(run_dir: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run_dir), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_of_a_big_job_is_a_summary(tmp_path: Path) -> None:
    _big_run_dir(tmp_path)
    out = _status(tmp_path)
    assert "pool train on node[1-3] (3 nodes)" in out
    assert "7 instance(s) on 3 node(s)" in out
    assert "train (owner of pool train): 3/3 ready · 3 Running" in out
    assert "web: 0/1 ready · 1 BackOff" in out
    assert "not as desired: 1 instance(s)" in out and "service_web  BackOff  on node1" in out
    assert "NAME " not in out  # no table of every instance


def test_all_and_json_still_give_every_instance(tmp_path: Path) -> None:
    h = _big_run_dir(tmp_path)
    table = _status(tmp_path, "--all")
    assert "NAME " in table and "service_shipper_node3" in table
    doc = json.loads(_status(tmp_path, "-o", "json"))
    assert doc == json.loads(json.dumps(snapshot(h.store, backend="fake", controller_pid=1)))


def test_adoption_restores_a_big_job_from_its_snapshot_and_deltas(tmp_path: Path) -> None:
    h = _big_run_dir(tmp_path)
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
