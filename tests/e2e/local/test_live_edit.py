"""Live recipe edits end to end on the local backend: save the file, watch the job converge."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e

POOL = """
name: live
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: {nodes}
  - name: watcher
    command: ["sleep", "1000"]
    placement: {{pool: train}}
    env: {{LEVEL: "{level}"}}
"""

SHIPPER = """
  - name: shipper
    command: ["sleep", "1000"]
    placement: {pool: train}
"""


def pids(state: dict) -> dict[str, int]:
    return {i["name"]: i["pid"] for i in state["instances"]}


def save(run: Run, text: str) -> None:
    # Write then rename, as editors do: the watcher must follow the path, not the inode.
    tmp = run.recipe.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    tmp.replace(run.recipe)


def generation_applied(run: Run, generation: int):
    def check(state: dict) -> bool:
        job = state["job"]
        return job["generation"] == generation and job["observed_generation"] == generation

    return check


def stop(run: Run) -> None:
    run.signal(signal.SIGINT)
    run.finish(gone_within=10)


def test_rider_add_change_remove_and_pool_growth(tmp_path: Path) -> None:
    run = Run(tmp_path, POOL.format(nodes=2, level=1), "--nodes", "4")
    try:
        first = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="running")
        before = pids(first)

        save(run, POOL.format(nodes=2, level=1) + SHIPPER)
        state = run.wait_state(generation_applied(run, 2), what="rider added")
        state = run.wait_state(
            lambda s: all(
                instance(s, f"service_shipper_node{k}")["phase"] == "Running" for k in (1, 2)
            ),
            what="shippers running",
        )
        assert {n: p for n, p in pids(state).items() if n in before} == before

        save(run, POOL.format(nodes=2, level=2) + SHIPPER)
        state = run.wait_state(generation_applied(run, 3), what="env change rolled out")
        after = pids(state)
        for name in ("service_watcher_node1", "service_watcher_node2"):
            assert after[name] != before[name]
            assert instance(state, name)["restarts"] == 0  # a rollout is no crash
            assert instance(state, name)["attempt"] == 1
        for name in ("service_train_node1", "service_train_node2"):
            assert after[name] == before[name]

        save(run, POOL.format(nodes=2, level=2))
        state = run.wait_state(
            lambda s: (
                generation_applied(run, 4)(s)
                and not any(i["service"] == "shipper" for i in s["instances"])
            ),
            what="shipper removed",
        )
        stopped = [
            e for e in events(run.run_dir) if e["reason"] == "Stopped" and "shipper" in e["object"]
        ]
        assert len(stopped) == 2

        save(run, POOL.format(nodes=3, level=2))
        state = run.wait_state(
            lambda s: (
                generation_applied(run, 5)(s)
                and instance(s, "service_train_node3")["phase"] == "Running"
                and instance(s, "service_watcher_node3")["phase"] == "Running"
            ),
            what="pool grown onto the spare node",
        )
        assert state["carve"]["pools"]["train"] == ["node1", "node2", "node3"]
        assert (run.run_dir / "recipes" / "gen-5.yaml").read_text() == run.recipe.read_text()
        assert (run.run_dir / "recipes" / "gen-1.yaml").exists()
        applied = [e for e in events(run.run_dir) if e["reason"] == "RecipeApplied"]
        assert len(applied) == 4
    finally:
        stop(run)


def test_broken_edits_are_rejected_and_touch_nothing(tmp_path: Path) -> None:
    good = POOL.format(nodes=2, level=1)
    run = Run(tmp_path, good)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="running")
        before = pids(state)

        save(run, good + "  - name: [unclosed\n")
        wait_for(
            lambda: any(e["reason"] == "RecipeRejected" for e in events(run.run_dir)),
            10,
            "broken YAML rejected",
        )
        save(run, good.replace("placement: {pool: train}", "placement: {pool: trian}"))
        wait_for(
            lambda: sum(e["reason"] == "RecipeRejected" for e in events(run.run_dir)) == 2,
            10,
            "invalid recipe rejected",
        )
        rejected = [e for e in events(run.run_dir) if e["reason"] == "RecipeRejected"]
        assert "invalid YAML" in rejected[0]["message"]
        assert "'trian' names no service that declares nodes" in rejected[1]["message"]
        assert f"{run.recipe}:" in rejected[1]["message"]
        state = run.wait_state(lambda s: s["recipe"].get("rejected"), what="rejection saved")
        assert pids(state) == before
        assert state["job"]["generation"] == 1

        save(run, good + SHIPPER)
        run.wait_state(generation_applied(run, 2), what="fixed recipe applied")
        assert {n: p for n, p in pids(run.state() or {}).items() if n in before} == before
    finally:
        stop(run)


def test_plan_against_a_running_job_previews_without_applying(tmp_path: Path) -> None:
    # The job watches the very file we preview, but holds edits for a yes (--apply confirm):
    # once it has seen the edit, anything applied could only have come from the preview.
    import json

    from srtr.runtime.control import send

    run = Run(tmp_path, POOL.format(nodes=2, level=1), "--apply", "confirm")
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="running")
        applied = (run.run_dir / "recipe.yaml").read_text()
        save(run, POOL.format(nodes=2, level=1) + SHIPPER)
        held = run.wait_state(lambda s: s["recipe"].get("pending"), what="the edit held")

        def preview(*output: str) -> str:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "srtr",
                    "plan",
                    str(run.recipe),
                    "--against",
                    str(run.run_dir),
                    *output,
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout

        out = preview()
        assert "+ service_shipper_node1" in out and "+ service_shipper_node2" in out
        assert "Plan: 2 add" in out
        assert json.loads(preview("-o", "json")) == held["recipe"]["pending"]
        state = run.state()
        assert state is not None and state["job"]["generation"] == 1
        assert not any(i["service"] == "shipper" for i in state["instances"])
        assert (run.run_dir / "recipe.yaml").read_text() == applied
        assert "RecipeApplied" not in [e["reason"] for e in events(run.run_dir)]

        # The preview was the truth: applying the held edit does what it said.
        send(run.run_dir, "apply")
        state = run.wait_state(generation_applied(run, 2), what="the edit applied")
        assert sorted(i["name"] for i in state["instances"] if i["service"] == "shipper") == [
            "service_shipper_node1",
            "service_shipper_node2",
        ]
    finally:
        stop(run)
