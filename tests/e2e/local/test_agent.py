"""End to end with `srtr up --launcher agent` on the local backend: every simulated node has
its own agent process, which starts, signals, probes and reaps the node's instances."""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from srtr.backends.agent.channel import LEASE
from srtr.store.rundir import read_heartbeat
from tests.support.e2e_util import (
    Run,
    cmdlines_with,
    events,
    instance,
    processes_with,
    tier_order,
    wait_for,
)

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]
AGENT = ("--launcher", "agent")

finish = functools.partial(Run.finish, gone_within=10.0)


def agent_pids(run: Run) -> dict[str, int]:
    """node → pid of the run's live agents (their environment carries the run's tag)."""
    found = {}
    for pid in processes_with(run.marker + "\0"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"srtr.backends.agent.node" in argv:
            found[argv[argv.index(b"--node") + 1].decode()] = pid
    return found


@pytest.mark.parametrize("example", ["pools.yaml", "http-rider.yaml"])
def test_examples_run_to_their_end_under_agents(tmp_path: Path, example: str) -> None:
    """pools: placement and a custom benchmark; http-rider: http probes run by the agent."""
    run = Run(tmp_path, (ROOT / "examples" / example).read_text(), *AGENT)
    assert finish(run, timeout=90) == 0, run.out + run.err
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Succeeded"
    assert state["job"]["launcher"] == "agent" and state["job"]["backend"] == "local"
    logs = run.run_dir / "logs"
    nodes = sorted(p.stem.removeprefix("agent-") for p in logs.glob("agent-*.log"))
    assert nodes == [n["name"] for n in state["nodes"]]
    for node in nodes:
        assert "every instance is gone" in (logs / f"agent-{node}.log").read_text()


HOLD = """
name: ahold
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.1}
  - name: base
    command: ["sleep", "1000"]
    start: before_workers
"""


def running(state: dict) -> bool:
    return state["job"]["phase"] == "Running" and all(
        i["pid"] is not None and i["phase"] in ("Running", "Ready") for i in state["instances"]
    )


def test_one_agent_per_node_tears_down_by_tier(tmp_path: Path) -> None:
    """(A killed rider's restart: tests/e2e/local/test_job.py, under both launchers.)"""
    run = Run(tmp_path, HOLD, *AGENT, "--nodes", "3")
    try:
        run.wait_state(running, what="every instance running")
        assert sorted(agent_pids(run)) == ["node1", "node2", "node3"]
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    seen = events(run.run_dir)
    tier0_exits, tier1 = tier_order(seen)
    assert tier0_exits and max(tier0_exits) < tier1
    base_exit = next(
        i for i, e in enumerate(seen) if e["reason"] == "Exited" and "service_base" in e["object"]
    )
    assert base_exit > tier1
    assert not agent_pids(run)


SECRET = """
name: asecret
services:
  - name: holder
    command: ["bash", "-c", "printf %s \\"$HF_TOKEN\\" | sha256sum; exec sleep 1000"]
    env: {{HF_TOKEN: "{secret}"}}
    readiness: {{log: {{pattern: " -"}}, timeout_seconds: 30, interval_seconds: 0.1}}
"""


def test_a_secret_reaches_its_instance_and_no_command_line(tmp_path: Path) -> None:
    secret = f"hf_{uuid.uuid4().hex}_a,b c'd$e"
    run = Run(tmp_path, SECRET.format(secret=secret), *AGENT)
    try:
        run.wait_state(
            lambda s: instance(s, "service_holder")["phase"] == "Ready", what="holder ready"
        )
        digest = hashlib.sha256(secret.encode()).hexdigest()
        assert digest in (run.run_dir / "logs" / "service_holder.out").read_text()
        assert cmdlines_with(secret) == []
        assert cmdlines_with(secret[:20]) == []
        run.signal(signal.SIGTERM)
        assert finish(run) == 143
    finally:
        run.close()


LOSS = """
name: aloss
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
    critical: true
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
"""


def test_a_killed_agent_loses_its_node_and_fails_a_critical_owner(tmp_path: Path) -> None:
    run = Run(tmp_path, LOSS, *AGENT)
    try:
        run.wait_state(running, what="every instance running")
        os.kill(agent_pids(run)["node2"], signal.SIGKILL)
        assert finish(run) == 1, run.out + run.err
    finally:
        run.close()
    state = run.state()
    assert state is not None
    assert instance(state, "service_owner_node2")["phase"] == "Lost"
    assert instance(state, "service_rider_node2")["phase"] == "Lost"
    assert instance(state, "service_owner_node2")["restarts"] == 0
    assert "critical instance service_owner_node2" in state["job"]["reason"]
    reasons = [(e["reason"], e["object"]) for e in events(run.run_dir)]
    assert ("NodeLost", "instance/service_owner_node2") in reasons


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_adopt_after_a_controller_crash_keeps_every_instance_and_agent(tmp_path: Path) -> None:

    run = Run(tmp_path, HOLD, *AGENT)
    try:
        state = run.wait_state(running, what="every instance running")
        pids = {i["name"]: i["pid"] for i in state["instances"]}
        agents = agent_pids(run)
        run.proc.kill()  # kill -9 the controller: its agents keep their instances
        run.wait(30)
        second = run.adopt()
        state = run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and running(s),
            what="the new controller to adopt every instance",
        )
        assert {i["name"]: i["pid"] for i in state["instances"]} == pids
        assert all(i["restarts"] == 0 for i in state["instances"])
        assert agent_pids(run) == agents  # the same agents, rejoined
        # The restored statuses read Running from the start; the adoption's verdict is its
        # event, recorded once every agent answered.
        adopted = wait_for(
            lambda: [e for e in events(run.run_dir) if e["reason"] == "Adopted"],
            30,
            "the adoption's event",
        )
        assert adopted[0]["message"].endswith(f"{len(pids)} instance(s) adopted, 0 gone"), adopted
        # Adopted instances are still the agents' children: a real exit status, a restart.
        os.kill(pids["service_rider_node2"], signal.SIGKILL)
        run.wait_state(
            lambda s: (
                instance(s, "service_rider_node2")["restarts"] == 1
                and instance(s, "service_rider_node2")["phase"] == "Running"
            ),
            what="the adopted rider restarted",
        )
        exits = [
            e["message"]
            for e in events(run.run_dir)
            if (e["reason"], e["object"]) == ("Exited", "instance/service_rider_node2")
        ]
        assert exits and "signal 9" in exits[-1], exits
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")


def test_without_adoption_the_agents_stop_everything_after_the_window(tmp_path: Path) -> None:
    import time

    run = Run(tmp_path, HOLD, *AGENT, "--adopt-window", "2")
    try:
        state = run.wait_state(running, what="every instance running")
        pids = [i["pid"] for i in state["instances"]]
        run.proc.kill()
        run.wait(30)
        crashed = time.monotonic()
        assert all(_alive(pid) for pid in pids)  # kept for a controller that may adopt them
        wait_for(lambda: not run.leftovers(), 20, "the agents to stop everything")
        assert time.monotonic() - crashed >= 1.5
    finally:
        run.close()
    logs = run.run_dir / "logs"
    assert "no controller adopted the job within 2s" in (logs / "agent-node1.log").read_text()


def _beat_ts(run: Run) -> object:
    beat = read_heartbeat(run.run_dir)
    return None if beat is None else beat.doc.get("ts")


STALL = """
name: astall
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
    stop_grace_seconds: 1
    restart: {backoff_seconds: 0.1}
"""


def test_a_stopped_controller_keeps_its_agents_and_their_work(tmp_path: Path) -> None:
    """SIGSTOP the controller for longer than the lease: its host's kernel still acknowledges
    the agents' heartbeats, so no agent fences (as kubelets keep their pods while the API
    server is down); SIGCONT: the controller counts its own stall as no node's silence, and
    nothing is lost or restarted."""
    run = Run(tmp_path, STALL, *AGENT)
    try:
        state = run.wait_state(running, what="every instance running")
        pids = [i["pid"] for i in state["instances"]]
        agents = agent_pids(run)
        controller = state["job"]["controller_pid"]
        os.kill(controller, signal.SIGSTOP)
        try:
            time.sleep(LEASE + 2.0)  # the stall itself, past every agent's lease
            assert all(_alive(p) for p in pids)
            stopped_at = _beat_ts(run)
        finally:
            os.kill(controller, signal.SIGCONT)
        wait_for(lambda: _beat_ts(run) != stopped_at, 15, "the controller to run again")
        state = run.wait_state(running, what="every instance still running")
        assert [i["pid"] for i in state["instances"]] == pids
        assert all(i["restarts"] == 0 for i in state["instances"]), state
        assert agent_pids(run) == agents
        logs = run.run_dir / "logs"
        for node in ("node1", "node2"):
            assert "fencing" not in (logs / f"agent-{node}.log").read_text()
        assert not [e for e in events(run.run_dir) if e.get("reason") == "NodeLost"]
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
