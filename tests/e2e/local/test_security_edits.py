"""Bad live edits never end a running job: a new service that cannot start fails alone, an
argv with a NUL byte is refused, so is an edit beyond what the local backend holds, and a
later good edit applies."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srtr.tui.viewmodel.panels import plan_view
from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e

GOOD = """
name: edits
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: 2
  - name: watcher
    command: ["sleep", "1000"]
    placement: {pool: train}
"""

MISSPELT = """
  - name: shipper
    command: ["slep-no-such-program", "1000"]
    critical: true
"""

NUL = """
  - name: nul
    command: ["sleep", "10\\u0000"]
"""

LATER = """
  - name: later
    command: ["sleep", "1000"]
"""


def _save(run: Run, text: str) -> None:
    tmp = run.recipe.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    tmp.replace(run.recipe)


def _pids(state: dict) -> dict[str, int]:
    return {i["name"]: i["pid"] for i in state["instances"] if i["phase"] == "Running"}


def test_a_new_service_that_cannot_start_fails_alone(tmp_path: Path) -> None:
    run = Run(tmp_path, GOOD)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="running")
        before = _pids(state)
        _save(run, GOOD + MISSPELT)
        state = run.wait_state(
            lambda s: "service_shipper" in (s["recipe"].get("failed") or []),
            timeout=30,
            what="the edit marked failed",
        )
        assert state["job"]["phase"] == "Running"
        assert instance(state, "service_shipper")["phase"] == "Failed"
        assert {n: p for n, p in _pids(state).items() if n in before} == before
        assert any(e["reason"] == "EditFailed" for e in events(run.run_dir))
        status = subprocess.run(
            [sys.executable, "-m", "srtr", "status", str(run.run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "the last recipe edit failed: service_shipper" in status.stdout
        view = plan_view(state)
        assert view is not None and view.summary.startswith("recipe edit failed")

        # A NUL byte in argv is refused at plan time: rejected, nothing touched.
        _save(run, GOOD + NUL)
        wait_for(
            lambda: any(
                e["reason"] == "RecipeRejected" and "NUL byte" in e["message"]
                for e in events(run.run_dir)
            ),
            15,
            "the NUL edit rejected",
        )
        # More than the local backend can hold: refused, not tried.
        _save(run, GOOD.replace("nodes: 2", "nodes: 10000"))
        wait_for(
            lambda: any(
                e["reason"] == "RecipeRejected" and "holds at most 8192" in e["message"]
                for e in events(run.run_dir)
            ),
            60,
            "the oversized edit rejected",
        )
        # A later good edit applies, and what ran before still runs.
        _save(run, GOOD + LATER)
        state = run.wait_state(
            lambda s: any(
                i["name"] == "service_later" and i["phase"] == "Running" for i in s["instances"]
            ),
            timeout=30,
            what="the later good edit applied",
        )
        assert state["job"]["phase"] == "Running"
        assert {n: p for n, p in _pids(state).items() if n in before} == before
        run.signal(signal.SIGINT)
        assert run.finish() == 130
    finally:
        run.close()
