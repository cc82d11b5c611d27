"""Health end to end on the local backend, under both launchers (processes, and a node agent
per simulated node): liveness restarts a wedged server and a silent (SIGSTOPped) process, and
a static rendezvous whose one rank crashes is restarted as a whole pool."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e
WORKLOADS = Path(__file__).resolve().parents[2] / "support" / "health_workloads.py"
LAUNCHERS = pytest.mark.parametrize(
    "launcher", [(), ("--launcher", "agent")], ids=["process", "agent"]
)
finish = functools.partial(Run.finish, gone_within=10.0)


def command(*args: str) -> str:
    return str([sys.executable, str(WORKLOADS), *args]).replace("'", '"')


def restarted_by_liveness(run: Run, name: str) -> dict:
    """The state once `name`'s second attempt is up after a LivenessFailed exit."""

    def up_again(state: dict) -> bool:
        inst = instance(state, name)
        return inst["attempt"] == 1 and inst["phase"] in ("Running", "Ready") and inst["ready"]

    state = run.wait_state(up_again, timeout=30, what=f"{name} relaunched and ready")
    inst = instance(state, name)
    assert inst["history"][0]["reason"] == "LivenessFailed"
    assert inst["restarts"] == 1
    unhealthy = [e for e in events(run.run_dir) if e["reason"] == "Unhealthy"]
    assert [e["object"] for e in unhealthy] == [f"instance/{name}"]
    return state


@LAUNCHERS
def test_a_wedged_http_server_is_restarted_by_its_liveness_probe(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    recipe = f"""
    name: wedged
    services:
      - name: web
        command: {command("wedged", "{node_ip}", "18731")}
        readiness: {{port: 18731, interval_seconds: 0.1}}
        liveness:
          http: {{port: 18731, path: /}}
          interval_seconds: 0.3
          timeout_seconds: 0.3
          failure_threshold: 2
        restart: {{policy: on-failure, backoff_seconds: 0.1}}
        stop_grace_seconds: 1
    """
    run = Run(tmp_path, recipe, *launcher)
    try:
        restarted_by_liveness(run, "service_web")
        unhealthy = next(e for e in events(run.run_dir) if e["reason"] == "Unhealthy")
        assert "no answer within 0.3s" in unhealthy["message"]
    finally:
        run.signal()
        finish(run)


@LAUNCHERS
def test_a_stopped_process_is_restarted_by_its_log_silence(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    recipe = f"""
    name: silent
    services:
      - name: chatty
        command: {command("chatty")}
        liveness:
          log: {{silence_seconds: 1}}
          interval_seconds: 0.25
          failure_threshold: 1
        restart: {{policy: on-failure, backoff_seconds: 0.1}}
        stop_grace_seconds: 0.5
    """
    run = Run(tmp_path, recipe, *launcher)
    try:
        restarted_by_liveness(run, "service_chatty")
        unhealthy = next(e for e in events(run.run_dir) if e["reason"] == "Unhealthy")
        assert "silent for" in unhealthy["message"]
    finally:
        run.signal()
        finish(run)


def rendezvous(crash: str, max_restarts: int) -> str:
    return f"""
    name: rdv
    services:
      - name: train
        nodes: 3
        terminal: true
        command: {command("rank", "{index}", "3", crash)}
        restart: {{policy: on-failure, scope: pool, max_restarts: {max_restarts},
                   backoff_seconds: 0.2}}
        stop_grace_seconds: 1
      - name: shipper
        placement: {{pool: train}}
        command: ["sleep", "1000"]
    """


@LAUNCHERS
def test_a_rank_that_crashes_once_is_gang_restarted_and_the_job_succeeds(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    run = Run(tmp_path, rendezvous("once", 2), *launcher)
    code = finish(run, timeout=60)
    assert code == 0, run.out + run.err
    seen = run.run_dir / "seen"
    assert {p.name: p.read_text() for p in seen.iterdir()} == {
        "rank0": "1",
        "rank1": "1",
        "rank2": "1",
    }
    found = events(run.run_dir)
    restarting = [e for e in found if e["reason"] == "PoolRestarting"]
    assert len(restarting) == 1
    assert "service_train_node2 exited with code 1" in restarting[0]["message"]
    assert "restart 1 of at most 2" in restarting[0]["message"]
    # The ranks srtr stopped for the pool restart are no failures.
    warned = {e["object"] for e in found if e["reason"] == "Exited" and e["type"] == "Warning"}
    assert warned == {"instance/service_train_node2"}
    state = run.state()
    assert state is not None
    shipper = [i for i in state["instances"] if i["service"] == "shipper"]
    assert all(i["attempt"] == 0 for i in shipper)  # riders kept running


@LAUNCHERS
def test_a_rank_that_always_crashes_ends_the_job_after_max_restarts(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    run = Run(tmp_path, rendezvous("always", 1), *launcher)
    code = finish(run, timeout=60)
    assert code == 1, run.out + run.err
    found = events(run.run_dir)
    assert [e["reason"] for e in found].count("PoolRestarting") == 1
    assert "PoolFailed" in [e["reason"] for e in found]
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Failed"
    assert "pool train failed" in state["job"]["reason"]
    assert "service_train_node2" in state["job"]["reason"]


HOLLOW_LIVE = """
name: hlive
services:
  - name: base
    command: ["sleep", "infinity"]
    nodes: 4
    liveness: {exec: {command: ["true"]}, interval_seconds: 0.2, failure_threshold: 2}
    restart: {policy: on-failure, backoff_seconds: 0.1}
"""


def hollow_control(run: Run, line: str) -> None:
    """One line to the hollow process's control FIFO (docs/agents.md, "Hollow mode")."""
    fd = os.open(run.run_dir / "hollow.ctl", os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def test_a_hollow_instance_made_unhealthy_is_restarted_by_its_agents_probe_loop(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, HOLLOW_LIVE, "--hollow")
    name = "service_base_node2"
    try:
        run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and all(i["phase"] == "Running" for i in s["instances"])
            ),
            what="the pool up",
        )
        hollow_control(run, f"unhealthy {name}")
        wait_for(
            lambda: any(e["reason"] == "Unhealthy" for e in events(run.run_dir)),
            what="the Unhealthy event",
        )
        hollow_control(run, f"healthy {name}")
        state = run.wait_state(
            lambda s: instance(s, name)["attempt"] == 1 and instance(s, name)["phase"] == "Running",
            what="the instance relaunched",
        )
        assert instance(state, name)["history"][0]["reason"] == "LivenessFailed"
        unhealthy = [e for e in events(run.run_dir) if e["reason"] == "Unhealthy"]
        assert [e["object"] for e in unhealthy] == [f"instance/{name}"]
        assert "hollow node, unhealthy" in unhealthy[0]["message"]
        assert all(i["attempt"] == 0 for i in state["instances"] if i["name"] != name)
        run.signal()
        assert finish(run) == 130
    finally:
        run.close()


@LAUNCHERS
def test_a_lost_node_is_replaced_by_a_spare_and_the_pool_relaunches(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    from srtr.runtime.control import send

    recipe = rendezvous("hold", 2).replace(
        "stop_grace_seconds: 1", "stop_grace_seconds: 1\n        replace_lost: true"
    )
    run = Run(tmp_path, recipe, "--nodes", "4", *launcher)
    try:
        wait_for(
            lambda: len(list((run.run_dir / "rdv" / "0").glob("rank*"))) == 3,
            what="the first rendezvous",
        )
        send(run.run_dir, "lose-node", node="node2")
        code = finish(run, timeout=60)
    finally:
        run.close()
    assert code == 0, run.out + run.err
    seen = {p.name: p.read_text() for p in (run.run_dir / "seen").iterdir()}
    assert seen == {"rank0": "1", "rank1": "1", "rank2": "1"}
    found = events(run.run_dir)
    restarting = [e for e in found if e["reason"] == "PoolRestarting"]
    assert len(restarting) == 1 and "was lost with its node node2" in restarting[0]["message"]
    assert ("Replaced", "pool/train") in [(e["reason"], e["object"]) for e in found]
    state = run.state()
    assert state is not None
    spare = instance(state, "service_train_node4")
    assert spare["index"] == 1 and spare["phase"] == "Succeeded"
