"""depends_on on real processes (examples/depends-on.yaml): the workers pool declared before
its scheduler starts once the scheduler is ready, the scheduler once its init service
`prepare` exited 0; killing the scheduler restarts it and then the workers (`restart: true`),
their restart budget untouched; an init service that exits non-zero fails the job naming its
log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = (ROOT / "examples" / "depends-on.yaml").read_text()
WORKERS = ("service_workers_node1", "service_workers_node2")


def _held() -> str:
    """The example without its terminal client: the job holds until stopped."""
    return EXAMPLE[: EXAMPLE.index("  - name: client")]


def test_the_example_starts_by_its_dependencies_and_ends_by_its_client(tmp_path: Path) -> None:
    run = Run(tmp_path, EXAMPLE)
    assert run.finish(90) == 0, run.out + run.err
    logs = run.run_dir / "logs"
    assert "data set staged" in (logs / "service_prepare.out").read_text()
    assert "has 2 workers" in (logs / "service_client.out").read_text()
    seen = [(e["reason"], e["object"]) for e in events(run.run_dir)]
    # prepare exits 0 (no stage-gate failure), then the scheduler, then the workers
    prepared = seen.index(("Exited", "instance/service_prepare"))
    launched = seen.index(("Launched", "instance/service_scheduler"))
    ready = seen.index(("Ready", "instance/service_scheduler"))
    assert prepared < launched
    for worker in WORKERS:
        assert seen.index(("Launched", f"instance/{worker}")) > ready


def test_killing_the_scheduler_restarts_it_and_then_its_workers(tmp_path: Path) -> None:
    run = Run(tmp_path, _held())
    try:
        state = run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and all(instance(s, w)["phase"] == "Ready" for w in WORKERS)
            ),
            what="the workers to be ready",
        )
        assert state["job"]["waiting"] == {}
        pid = instance(state, "service_scheduler")["pid"]
        os.kill(pid, signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_scheduler")["attempt"] == 1
                and all(
                    instance(s, w)["attempt"] == 1 and instance(s, w)["phase"] == "Ready"
                    for w in WORKERS
                )
            ),
            timeout=60,
            what="the scheduler and then its workers to restart",
        )
        assert instance(state, "service_scheduler")["restarts"] == 1  # its own crash
        for worker in WORKERS:
            assert instance(state, worker)["restarts"] == 0  # restarted with it: no budget
        seen = events(run.run_dir)
        reasons = [(e["reason"], e["object"]) for e in seen]
        ready_again = max(
            i for i, r in enumerate(reasons) if r == ("Ready", "instance/service_scheduler")
        )
        for worker in WORKERS:
            why = [
                e["message"]
                for e in seen
                if e["object"] == f"instance/{worker}" and e["reason"] == "DependencyRestarted"
            ]
            assert why and why[0].startswith("services[scheduler] restarted"), why
            relaunched = max(
                i for i, r in enumerate(reasons) if r == ("Launched", f"instance/{worker}")
            )
            assert relaunched > ready_again  # only once the scheduler was ready again
        log = (run.run_dir / "logs" / "service_scheduler.out").read_text()
        assert log.count("scheduler at tcp://") == 2
        # the workers registered again with the new scheduler
        assert "registered; 2 in all" in log.rsplit("scheduler at tcp://", 1)[1]

        # A user's restart of the scheduler restarts the workers too.
        done = subprocess.run(
            [sys.executable, "-m", "srtr", "restart", str(run.run_dir), "scheduler"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done
        state = run.wait_state(
            lambda s: (
                instance(s, "service_scheduler")["attempt"] == 2
                and all(
                    instance(s, w)["attempt"] == 2 and instance(s, w)["phase"] == "Ready"
                    for w in WORKERS
                )
            ),
            timeout=60,
            what="the workers to restart with the scheduler's user restart",
        )
        assert all(instance(state, w)["restarts"] == 0 for w in WORKERS)
    finally:
        run.signal(signal.SIGINT)
        run.finish(gone_within=10)


def test_an_init_service_that_fails_fails_the_job_naming_its_log(tmp_path: Path) -> None:
    broken = EXAMPLE.replace(
        'print("prepare on {node}: data set staged", flush=True)',
        'raise SystemExit("prepare on {node}: no data set")',
    )
    assert broken != EXAMPLE
    run = Run(tmp_path, broken)
    assert run.finish(60) == 1, run.out + run.err
    state = run.state()
    assert state is not None
    reason = state["job"]["reason"]
    assert "services[prepare] exited with code 1" in reason, reason
    assert "see logs/service_prepare.out" in reason, reason
    assert instance(state, "service_scheduler")["attempt"] == -1  # never started
