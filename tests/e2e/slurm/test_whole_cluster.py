"""One job on every node of the cluster it runs on: on the default 4-node test cluster it
is a small job, on a 32-node one (`scripts/slurm-cluster up --nodes 32`) it spans 32
separate hosts, one agent (or one step per instance) on each.

A pool on every node but one, a rider on each of its nodes, the last node a spare. Every
instance runs on its own node (its hostname says so on separate hosts), and under agents the
controller holds one connection per node, from that node's address; SLURM then drains
a pool node mid-job and the spare takes its place; SIGINT tears the whole job down.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from srtr.backends.agent.relayed import groups
from tests.support import slurm_util
from tests.support.e2e_util import Run, events, wait_for
from tests.support.slurm_launchers import LAUNCHERS, drain, no_job_left, up

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    """Every test here runs on the cluster (see conftest.slurm_cluster)."""


WHOLE = """
name: swhole
services:
  - name: owner
    command:
      - bash
      - -c
      - echo on=$SLURMD_NODENAME host=$(hostname); exec sleep 1000
    nodes: {pool}
    critical: true
    replace_lost: true
    stop_grace_seconds: 1  # under agents the spare waits for the lease and this grace
  - name: rider
    command: ["sleep", "1000"]
    placement: {{pool: owner}}
    stop_grace_seconds: 1
"""


def all_running(state: dict, count: int) -> bool:
    """`count` instances running (under agents: a pid; steps: a step too)."""
    agent = state["job"]["launcher"] == "agent"
    live = [
        i
        for i in state["instances"]
        if i["phase"] in ("Running", "Ready")
        and i["pid"] is not None
        and (agent or i["step"] is not None)
    ]
    return state["job"]["phase"] == "Running" and len(live) == count


def agent_peers(run: Run) -> list[str]:
    """The address of every connection to the controller's agent listener (on this host)."""
    port = (run.run_dir / "agents.addr").read_text().strip().rsplit(":", 1)[1]
    text = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return sorted(line.split()[-1].rsplit(":", 1)[0] for line in text.splitlines())


def relays_speaking(run: Run) -> dict[str, int]:
    """relay node -> how many of its group's nodes' sockets left the controller's epoll."""
    path = run.run_dir / "logs" / "srtr.log"
    text = path.read_text() if path.exists() else ""
    found = re.finditer(r"the relay on (\S+) speaks for (\d+) of its group", text)
    return {m[1]: int(m[2]) for m in found}


def said(run: Run, name: str) -> str:
    path = run.run_dir / "logs" / f"{name}.out"
    return path.read_text() if path.exists() else ""


@LAUNCHERS
@pytest.mark.timeout(600)
def test_a_pool_on_every_node_loses_one_to_its_spare(tmp_path: Path, launcher: str) -> None:
    nodes = slurm_util.cluster_nodes()
    pool = len(nodes) - 1
    recipe = WHOLE.format(pool=pool)
    run = Run(
        tmp_path, recipe, *up(launcher, "--nodes", str(len(nodes))), env=slurm_util.outside_env()
    )
    victim = None
    try:
        state = run.wait_state(lambda s: all_running(s, 2 * pool), 240, "every instance running")
        owners = state["carve"]["pools"]["owner"]
        (spare,) = state["carve"]["spares"]
        assert sorted([*owners, spare], key=nodes.index) == nodes  # the whole cluster
        hosts = slurm_util.separate_hosts()
        for node in owners:
            # Each owner on its own node (its own host: hostname nodeK on separate hosts).
            want = f"on={node} host={node}" if hosts else f"on={node} "
            wait_for(lambda n=node, w=want: w in said(run, f"service_owner_{n}"), 60, want)
        if launcher == "agent":
            # One connection per agent, one agent per node: from each node's own address.
            peers = agent_peers(run)
            assert len(peers) == len(nodes), peers
            if hosts:
                assert peers == sorted(slurm_util.node_ip(n) for n in nodes)
            # From 16 nodes on, relays: every group's members' datagrams crossed the hosts'
            # network to their relay, and their sockets left the controller's epoll.
            cut = groups(nodes)
            speaking = (
                wait_for(
                    lambda: len(relays_speaking(run)) >= len(cut) and relays_speaking(run),
                    60,
                    f"{len(cut)} relays",
                )
                if cut
                else {}
            )
            assert all(count >= 1 for count in speaking.values()), speaking
            assert {next(g for g in cut if r in g)[0] for r in speaking} == {g[0] for g in cut}
        victim = owners[len(owners) // 2]
        drain(victim)
        state = run.wait_state(
            lambda s: (
                all_running(s, 2 * pool)
                and {f"service_owner_{spare}", f"service_rider_{spare}"}
                <= {i["name"] for i in s["instances"] if i["phase"] == "Running"}
            ),
            120,
            f"the spare to take {victim}'s place",
        )
        # The spare takes the lost node's place in the pool's order.
        assert state["carve"]["pools"]["owner"] == [spare if n == victim else n for n in owners]
        assert state["carve"]["lost"] == [victim]
        reasons = [(e["reason"], e["object"]) for e in events(run.run_dir)]
        assert ("NodeLost", f"instance/service_owner_{victim}") in reasons
        assert "Replaced" in [r for r, _ in reasons]
        # Only the lost node's instances left it: the others never restarted.
        moved = {f"service_owner_{victim}", f"service_rider_{victim}"}
        assert all(i["restarts"] == 0 for i in state["instances"] if i["name"] not in moved)
        run.signal(signal.SIGINT)
        assert run.finish(timeout=120, gone_within=60) == 130
    finally:
        run.close()
        if victim is not None:
            drain(victim, "resume")
    no_job_left("srtr-swhole")
