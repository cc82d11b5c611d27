"""A run dir as a big job's controller leaves it: state.json a snapshot with a delta log and
summary.json (the state writer in its big-job mode), from a store the fake backend drives."""

from __future__ import annotations

import asyncio
from pathlib import Path

from srtr.store.persist import head
from srtr.store.state_log import StateWriter
from tests.support.controller_harness import Harness

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


def big_run_dir(tmp_path: Path) -> Harness:
    """A job of 7 instances, all Running but `service_web`, whose crash (BackOff) is only in
    the delta log; returns the harness, whose store is the reference."""

    async def body() -> Harness:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1, summary_period=0)  # summary.json at once
        await h.settle()
        writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)
        h.exit("service_web", 3)
        await h.settle()
        writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)
        return h

    return asyncio.run(body())
