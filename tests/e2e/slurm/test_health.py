"""Health on the separate-hosts SLURM cluster (scripts/slurm-cluster), under both launchers:
liveness restarts a wedged server and a silent (SIGSTOPped) process on its node, and a
static rendezvous whose one rank crashes is restarted as a whole pool, or fails the job
once its pool's budget is spent. The workloads are tests/support/health_workloads.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.local.test_health import command, rendezvous
from tests.support import slurm_util
from tests.support.e2e_util import Run, events, instance, wait_for
from tests.support.slurm_launchers import LAUNCHERS, drain, finish, no_job_left, start, up

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


def up_again(name: str) -> Callable[[dict], bool]:
    def check(state: dict) -> bool:
        inst = instance(state, name)
        return inst["attempt"] == 1 and inst["phase"] in ("Running", "Ready") and inst["ready"]

    return check


@LAUNCHERS
def test_liveness_restarts_a_wedged_server_and_a_silent_process(tmp_path, launcher: str) -> None:  # type: ignore[no-untyped-def]
    recipe = f"""
    name: shealth
    services:
      - name: web
        command: {command("wedged", "0.0.0.0", "18731")}
        readiness: {{port: 18731, interval_seconds: 0.2, timeout_seconds: 60}}
        liveness:
          http: {{port: 18731, path: /}}
          interval_seconds: 0.5
          timeout_seconds: 0.5
          failure_threshold: 2
        restart: {{policy: on-failure, backoff_seconds: 0.1}}
        stop_grace_seconds: 1
      - name: chatty
        command: {command("chatty")}
        liveness:
          log: {{silence_seconds: 1.5}}
          interval_seconds: 0.5
          failure_threshold: 1
        restart: {{policy: on-failure, backoff_seconds: 0.1}}
        stop_grace_seconds: 1
    """
    run = start("host", tmp_path, recipe, *up(launcher), nodes=1, name="srtr-shealth")
    try:
        for name in ("service_web", "service_chatty"):
            state = run.wait_state(up_again(name), 90, f"{name} relaunched")
            assert instance(state, name)["history"][0]["reason"] == "LivenessFailed"
        unhealthy = {
            e["object"]: e["message"] for e in events(run.run_dir) if e["reason"] == "Unhealthy"
        }
        assert "no answer within 0.5s" in unhealthy["instance/service_web"]
        assert "silent for" in unhealthy["instance/service_chatty"]
        run.signal()
        assert finish(run) == 130, run.out + run.err
    finally:
        run.close()
    no_job_left("srtr-shealth")


@LAUNCHERS
@pytest.mark.parametrize("crash", ["once", "always"])
def test_a_static_rendezvous_on_separate_hosts_is_gang_restarted(
    tmp_path: Path, launcher: str, crash: str
) -> None:
    run = start("host", tmp_path, rendezvous(crash, 1), *up(launcher), nodes=3, name="srtr-srdv")
    try:
        code = finish(run)
    finally:
        run.close()
    no_job_left("srtr-srdv")
    found = events(run.run_dir)
    assert [e["reason"] for e in found].count("PoolRestarting") == 1
    if crash == "once":
        assert code == 0, run.out + run.err
        seen = {p.name: p.read_text() for p in (run.run_dir / "seen").iterdir()}
        assert seen == {"rank0": "1", "rank1": "1", "rank2": "1"}
    else:
        assert code == 1, run.out + run.err
        state = run.state()
        assert state is not None and "pool train failed" in state["job"]["reason"]


@LAUNCHERS
def test_a_drained_node_is_replaced_and_the_pool_relaunches(tmp_path: Path, launcher: str) -> None:
    """SLURM drains a node of a gang-scoped pool (its loss): the others are stopped, a spare
    takes the lost one's place and index, and the whole pool's second rendezvous succeeds."""
    recipe = rendezvous("hold", 2).replace(
        "stop_grace_seconds: 1", "stop_grace_seconds: 1\n        replace_lost: true"
    )
    run = Run(tmp_path, recipe, *up(launcher, "--nodes", "4"), env=slurm_util.outside_env())
    victim = None
    try:
        state = run.wait_state(lambda s: s["carve"]["pools"].get("train"), 60, "the carve")
        victim = state["carve"]["pools"]["train"][1]
        wait_for(
            lambda: len(list((run.run_dir / "rdv" / "0").glob("rank*"))) == 3,
            90,
            "the first rendezvous",
        )
        drain(victim)
        code = finish(run)
    finally:
        run.close()
        if victim is not None:
            drain(victim, "resume")
    no_job_left("srtr-rdv")
    assert code == 0, run.out + run.err
    seen = {p.name: p.read_text() for p in (run.run_dir / "seen").iterdir()}
    assert seen == {"rank0": "1", "rank1": "1", "rank2": "1"}
    found = events(run.run_dir)
    assert [e["reason"] for e in found].count("PoolRestarting") == 1
    assert "Replaced" in [e["reason"] for e in found]
