"""`srtr status` of a big job: a summary from summary.json (pools, counts, what is not as
desired) instead of a row per instance, unless asked for every instance (`--all`, `-o json`).

The run dir is synthetic: a store driven by the fake backend, written by the state writer in
its big-job mode, as a controller would have left it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from srtr.store.persist import snapshot
from tests.support.big_state import big_run_dir


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
    big_run_dir(tmp_path)
    out = _status(tmp_path)
    assert "pool train on node[1-3] (3 nodes)" in out
    assert "7 instance(s) on 3 node(s)" in out
    assert "train (owner of pool train): 3/3 ready · 3 Running" in out
    assert "web: 0/1 ready · 1 BackOff" in out
    assert "not as desired: 1 instance(s)" in out and "service_web  BackOff  on node1" in out
    assert "NAME " not in out  # no table of every instance


def test_all_and_json_still_give_every_instance(tmp_path: Path) -> None:
    h = big_run_dir(tmp_path)
    table = _status(tmp_path, "--all")
    assert "NAME " in table and "service_shipper_node3" in table
    doc = json.loads(_status(tmp_path, "-o", "json"))
    assert doc == json.loads(json.dumps(snapshot(h.store, backend="fake", controller_pid=1)))
