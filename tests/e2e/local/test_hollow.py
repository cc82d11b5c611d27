"""Hollow mode end to end (`srtr up --hollow`): ONE process runs every node's real agent, each
with its own connection to the controller, on simulated processes (no fork). What the
controller does with them is srtr's real behaviour: restarts, node loss, teardown."""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e_util import Run, cmdlines_with, events, instance, wait_for

pytestmark = pytest.mark.e2e
HOLLOW = "srtr.backends.agent.hollow"
SIMULATED_PIDS = 1 << 23  # above Linux's largest pid: hollow.py's first simulated pid

finish = functools.partial(Run.finish, gone_within=15.0)


def hollow_pids(run: Run) -> list[int]:
    return [pid for pid, line in cmdlines_with(HOLLOW) if str(run.run_dir) in line]


def control(run: Run, line: str) -> None:
    """One line to the hollow process's control FIFO (docs/agents.md, "Hollow mode")."""
    fd = os.open(run.run_dir / "hollow.ctl", os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def up(state: dict[str, Any], count: int) -> bool:
    live = [i for i in state["instances"] if i["phase"] in ("Running", "Ready")]
    return state["job"]["phase"] == "Running" and len(live) == count


FLEET = """
name: hfleet
services:
  - name: base
    command: ["sleep", "infinity"]
    nodes: 64
  - name: web
    command: ["python3", "-m", "http.server", "9930", "--bind", "{node_ip}"]
    placement: {pool: base}
    readiness: {tcp: {port: 9930}, timeout_seconds: 30, interval_seconds: 0.2}
  - name: side1
    command: ["sleep", "infinity"]
    placement: {pool: base}
  - name: side2
    command: ["sleep", "infinity"]
    placement: {pool: base}
"""


def test_64_hollow_nodes_run_256_instances_in_one_process_and_stop_on_sigterm(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, FLEET, "--hollow")
    try:
        state = run.wait_state(lambda s: up(s, 256), timeout=120, what="256 instances up")
        assert state["job"]["launcher"] == "agent"
        # One hollow process, no per-node agent, and nothing forked per instance.
        assert len(hollow_pids(run)) == 1
        assert not [p for p, line in cmdlines_with("agent.node") if str(run.run_dir) in line]
        assert not cmdlines_with("http.server 9930")
        assert all(i["pid"] >= SIMULATED_PIDS for i in state["instances"])
        # The tcp probes ran (simulated, on the node's agent): every web instance is Ready.
        state = run.wait_state(
            lambda s: all(i["phase"] == "Ready" for i in s["instances"] if i["service"] == "web"),
            what="every web instance Ready",
        )
        log = (run.run_dir / "logs" / "service_web_node7.out").read_text()
        assert "service_web_node7 attempt 0 simulated on node7" in log
        agents = (run.run_dir / "logs" / "hollow.log").read_text()
        assert agents.count("serving the controller") == 64
        run.signal(signal.SIGTERM)
        assert finish(run, timeout=60) == 143
    finally:
        run.close()
    assert not hollow_pids(run)
    exits = [e for e in events(run.run_dir) if e["reason"] == "Exited"]
    assert len(exits) == 256 and all("signal 15" in e["message"] for e in exits)


PAIR = """
name: hpair
services:
  - name: owner
    command: ["sleep", "infinity"]
    nodes: 4
  - name: rider
    command: ["sleep", "infinity"]
    placement: {pool: owner}
    restart: {policy: on-failure, backoff_seconds: 0.1}
"""


def test_a_hollow_instance_told_to_exit_non_zero_is_restarted(tmp_path: Path) -> None:
    run = Run(tmp_path, PAIR, "--hollow")
    try:
        before = run.wait_state(lambda s: up(s, 8), what="8 instances up")
        control(run, "exit service_rider_node3 7")
        state = run.wait_state(
            lambda s: (
                instance(s, "service_rider_node3")["restarts"] == 1
                and instance(s, "service_rider_node3")["phase"] == "Running"
            ),
            what="the rider restarted",
        )
        old = instance(before, "service_rider_node3")["pid"]
        assert instance(state, "service_rider_node3")["pid"] not in (None, old)
        exits = [
            e["message"]
            for e in events(run.run_dir)
            if (e["reason"], e["object"]) == ("Exited", "instance/service_rider_node3")
        ]
        assert exits and "code 7" in exits[0], exits
        log = (run.run_dir / "logs" / "service_rider_node3.out").read_text()
        assert "attempt 1 starting on node3" in log
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()


@pytest.mark.parametrize(
    ("verb", "why"), [("kill", "closed the connection"), ("freeze", "was silent for")]
)
def test_a_killed_or_frozen_hollow_node_is_lost(tmp_path: Path, verb: str, why: str) -> None:
    """kill: the node's connection drops (a dead machine's agent); freeze: its agent goes
    silent with the connection open (a hung node), which only the heartbeats reveal."""
    run = Run(tmp_path, PAIR, "--hollow")
    try:
        run.wait_state(lambda s: up(s, 8), what="8 instances up")
        control(run, f"{verb} node2")

        def lost() -> list[dict[str, Any]]:
            found = [e for e in events(run.run_dir) if e["reason"] == "NodeLost"]
            return found if len(found) == 2 else []

        seen = wait_for(lost, 30, "node2's two instances lost")
        assert {e["object"] for e in seen} == {
            "instance/service_owner_node2",
            "instance/service_rider_node2",
        }
        assert all(why in e["message"] for e in seen), seen
        state = run.wait_state(
            lambda s: instance(s, "service_owner_node2")["phase"] == "Lost", what="Lost"
        )
        assert instance(state, "service_owner_node1")["phase"] == "Running"
        run.signal(signal.SIGINT)
        finish(run)
    finally:
        run.close()
    assert not hollow_pids(run)


GRACE = """
name: hgrace
services:
  - name: plain
    command: ["sleep", "infinity"]
  - name: stubborn
    command: ["sleep", "infinity"]
    env: {SRTR_HOLLOW_ON_TERM: ignore}
    stop_grace_seconds: 0.5
  - name: tidy
    command: ["sleep", "infinity"]
    env: {SRTR_HOLLOW_ON_TERM: "0.2"}
"""


def test_hollow_instances_honour_sigterm_and_the_grace_like_processes(tmp_path: Path) -> None:
    run = Run(tmp_path, GRACE, "--hollow")
    try:
        run.wait_state(lambda s: up(s, 3), what="3 instances up")
        run.signal(signal.SIGTERM)
        assert finish(run) == 143
    finally:
        run.close()
    exits = {
        e["object"].removeprefix("instance/"): e["message"]
        for e in events(run.run_dir)
        if e["reason"] == "Exited"
    }
    assert "signal 15" in exits["service_plain"], exits
    assert "signal 9" in exits["service_stubborn"], exits  # ignored SIGTERM: killed at grace
    assert "code 0" in exits["service_tidy"], exits  # handled SIGTERM, exited by itself


def test_hollow_is_for_the_local_backend_only(tmp_path: Path) -> None:
    run = Run(tmp_path, PAIR, "--hollow", "--launcher", "process")
    assert run.wait(30) == 2
    assert "--hollow" in run.err and "Traceback" not in run.err


def test_an_adopted_hollow_job_keeps_its_instances_and_loses_one_node_at_a_time(
    tmp_path: Path,
) -> None:
    """kill -9 the controller; `srtr up --adopt` rejoins the hollow agents (same simulated
    pids, no restart), and `lose-node` then takes one node, not the whole hollow process."""

    from srtr.runtime.control import send

    run = Run(tmp_path, PAIR, "--hollow")
    try:
        state = run.wait_state(lambda s: up(s, 8), what="8 instances up")
        pids = {i["name"]: i["pid"] for i in state["instances"]}
        hollow = hollow_pids(run)
        run.proc.kill()
        run.wait(30)
        second = run.adopt()
        state = run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and up(s, 8),
            what="the new controller to adopt every instance",
        )
        assert {i["name"]: i["pid"] for i in state["instances"]} == pids
        assert all(i["restarts"] == 0 for i in state["instances"])
        assert hollow_pids(run) == hollow
        send(run.run_dir, "lose-node", node="node2")
        state = run.wait_state(
            lambda s: instance(s, "service_owner_node2")["phase"] == "Lost", what="node2 lost"
        )
        assert instance(state, "service_owner_node1")["phase"] == "Running"
        assert hollow_pids(run) == hollow  # the other nodes' agents live on
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")


GROW = """
name: hgrow
services:
  - name: owner
    command: ["sleep", "infinity"]
    nodes: {nodes}
  - name: rider
    command: ["sleep", "infinity"]
    placement: {{pool: owner}}
"""


def grow_env() -> dict[str, str]:
    # Granted inside the request itself: such a grant must join too (fixed in 84446cc).
    return {**os.environ, "SRTR_LOCAL_PROVISION_DELAY": "0"}


def node_names(state: dict[str, Any]) -> list[str]:
    return [n["name"] for n in state["nodes"]]


def test_a_hollow_pool_grows_past_the_allocation_and_gives_the_nodes_back(
    tmp_path: Path,
) -> None:
    """8 hollow nodes, a live edit to 10: the simulated provider grants 2 nodes, the hollow
    process starts their agents (`add NODE` on its FIFO), the new owners and riders run
    there; saving 8 again gives them back and ends those agents, and no node is lost."""
    run = Run(tmp_path, GROW.format(nodes=8), "--hollow", env=grow_env())
    try:
        run.wait_state(lambda s: up(s, 16), what="16 instances up")
        hollow = hollow_pids(run)
        run.recipe.write_text(GROW.format(nodes=10))
        new = [f"service_{svc}_node{k}" for svc in ("owner", "rider") for k in (9, 10)]
        grown = run.wait_state(
            lambda s: up(s, 20) and all(instance(s, n)["phase"] == "Running" for n in new),
            what="the instances on node9 and node10 running",
        )
        assert set(grown["grow"]["provisioned"]) == {"node9", "node10"}
        assert node_names(grown)[-2:] == ["node9", "node10"]
        assert all(instance(grown, n)["pid"] >= SIMULATED_PIDS for n in new)
        assert hollow_pids(run) == hollow  # the same process runs the new nodes' agents
        log = (run.run_dir / "logs" / "service_rider_node10.out").read_text()
        assert "service_rider_node10 attempt 0 simulated on node10" in log
        joined = [e["message"] for e in events(run.run_dir) if e["reason"] == "NodesJoined"]
        assert len(joined) == 1 and joined[0].endswith("joined: node9, node10"), joined

        run.recipe.write_text(GROW.format(nodes=8))
        shrunk = run.wait_state(
            lambda s: node_names(s) == [f"node{k}" for k in range(1, 9)] and up(s, 16),
            what="node9 and node10 given back",
        )
        assert shrunk["grow"]["provisioned"] == []
        assert [r["phase"] for r in shrunk["grow"]["requests"]] == ["Released"]
        released = [e["message"] for e in events(run.run_dir) if e["reason"] == "NodesReleased"]
        assert released == ["gave node9, node10 back to local (request hgrow-grow-1)"]
        agents = run.run_dir / "logs" / "hollow.log"
        wait_for(
            lambda: agents.read_text().count("every instance is gone") >= 2,
            20,
            "the agents of node9 and node10 to end",
        )
        assert "added node9" in agents.read_text() and "removed node10" in agents.read_text()
        assert hollow_pids(run) == hollow  # the other nodes' agents live on
        assert not [e for e in events(run.run_dir) if e["reason"] == "NodeLost"]
        assert all(instance(shrunk, f"service_owner_node{k}")["restarts"] == 0 for k in (1, 8))
        run.signal(signal.SIGTERM)
        assert finish(run) == 143
    finally:
        run.close()
    assert not hollow_pids(run)
    assert not [e for e in events(run.run_dir) if e["reason"] == "NodeLost"]


def test_a_hollow_process_serves_its_added_nodes_after_its_first_ones_ended(
    tmp_path: Path,
) -> None:
    """The hollow process lives as long as any of its agents does: node1 (its only first
    node) is killed once node2 joined, and node2's instances still run."""
    run = Run(tmp_path, GROW.format(nodes=1), "--hollow", env=grow_env())
    try:
        run.wait_state(lambda s: up(s, 2), what="2 instances up")
        hollow = hollow_pids(run)
        run.recipe.write_text(GROW.format(nodes=2))
        run.wait_state(lambda s: up(s, 4), what="the instances of node2 running")
        control(run, "kill node1")
        state = run.wait_state(
            lambda s: instance(s, "service_owner_node1")["phase"] == "Lost", what="node1 lost"
        )
        assert hollow_pids(run) == hollow
        assert instance(state, "service_rider_node2")["phase"] == "Running"
        run.signal(signal.SIGTERM)
        finish(run)
    finally:
        run.close()
    assert not hollow_pids(run)
    exits = {e["object"] for e in events(run.run_dir) if e["reason"] == "Exited"}
    assert {"instance/service_owner_node2", "instance/service_rider_node2"} <= exits


def test_control_lines_wait_out_a_full_fifo_without_blocking_the_loop(tmp_path: Path) -> None:
    """More lines than a FIFO holds: the sender waits for room while the loop runs on, and
    the reader gets every line whole and in order; each write is whole lines of at most
    PIPE_BUF bytes (what the kernel never cuts nor interleaves)."""
    import asyncio
    import select

    from srtr.backends.agent.hollow_starter import ControlFifo, _chunks

    path = tmp_path / "hollow.ctl"
    os.mkfifo(path, 0o600)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    lines = [f"add node{k}" for k in range(20_000)]  # ~240 KB: the FIFO fills several times

    async def main() -> tuple[bytes, bool]:
        got = bytearray()
        sending = asyncio.create_task(ControlFifo(path).send(lines))
        waited: bool | None = None
        ticks = 0
        while True:
            ticks += 1
            await asyncio.sleep(0)  # the loop runs while the sender waits for room
            if ticks % 50:
                continue  # a slow reader: the FIFO fills between reads
            if waited is None:
                waited = not sending.done()
            try:
                chunk = os.read(reader, 65536)
            except BlockingIOError:  # empty, the sender still there
                chunk = b""
            got += chunk
            if not chunk and sending.done():
                break
        await sending
        return bytes(got), bool(waited)

    try:
        got, waited = asyncio.run(main())
    finally:
        os.close(reader)
    assert waited  # the FIFO was full before the first read: the sender had to wait
    assert got.decode().splitlines() == lines
    chunks = _chunks(lines)
    assert all(len(c) <= select.PIPE_BUF and c.endswith(b"\n") for c in chunks)
    assert b"".join(chunks) == got


STAGED = """
name: hstaged
services:
  - name: base
    command: ["sleep", "infinity"]
    nodes: 8
    restart: {policy: on-failure, backoff_seconds: 0}
  - name: side1
    command: ["sleep", "infinity"]
    placement: {pool: base}
    restart: {policy: on-failure, backoff_seconds: 0}
  - name: side2
    command: ["sleep", "infinity"]
    placement: {pool: base}
    restart: {policy: on-failure, backoff_seconds: 0}
    readiness: {tcp: {port: 9931}, timeout_seconds: 120, interval_seconds: 0.2}
  - name: side3
    command: ["sleep", "infinity"]
    placement: {pool: base}
    restart: {policy: on-failure, backoff_seconds: 0}
"""


def test_a_node_lost_during_stage_2_loses_its_later_stage_members_too(tmp_path: Path) -> None:
    """As benchmarks/largest.py's job, in small: a node lost while stage side2 launches.
    Its side3 member is Lost when its stage comes, never launched in a loop there, and the
    job runs on the other seven nodes. (`kill`, not `freeze`: a node frozen while the other
    nodes' probes fail takes every node's heartbeats with it about every other run, on the
    channel's side, which this test is not about.)"""
    side2 = [f"service_side2_node{k}" for k in range(1, 9)]
    run = Run(tmp_path, STAGED, "--hollow")
    try:
        # The FIFO comes before the agents dial in: stage side2's gate stays open until told.
        wait_for(lambda: (run.run_dir / "hollow.ctl").exists(), 60, "the hollow control FIFO")
        control(run, "\n".join(f"unhealthy {name}" for name in side2))
        state = run.wait_state(
            lambda s: instance(s, "service_side2_node3")["pid"] is not None,
            timeout=60,
            what="stage side2 launched",
        )
        assert instance(state, "service_side2_node3")["phase"] != "Ready"
        control(run, "kill node3")
        state = run.wait_state(
            lambda s: instance(s, "service_side2_node3")["phase"] == "Lost",
            what="node3 lost during stage side2",
        )
        assert [i["name"] for i in state["instances"] if i["phase"] == "Lost"] == [
            f"service_{service}_node3" for service in ("base", "side1", "side2")
        ]
        assert instance(run.state() or {}, "service_side3_node3")["phase"] == "Pending"
        control(run, "\n".join(f"healthy {name}" for name in side2))
        state = run.wait_state(lambda s: up(s, 28), timeout=60, what="28 instances up")
        assert instance(state, "service_side3_node3")["phase"] == "Lost"
        assert instance(state, "service_side3_node3")["restarts"] == 0
        rider = [
            (e["reason"], e["message"])
            for e in events(run.run_dir)
            if e["object"] == "instance/service_side3_node3"
        ]
        assert [r for r, _ in rider] == ["NodeLost"], rider
        assert "cannot start" in rider[0][1] and "node3" in rider[0][1], rider
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
    assert not hollow_pids(run)


def test_a_launch_longer_than_a_hollow_agents_tls_read_reaches_it_whole(tmp_path: Path) -> None:
    # The hollow process reads each TLS connection TLS_READ bytes at a time (not asyncio's
    # 256 KiB): a longer message, here a Launch with a 100 KB variable, takes several reads.
    big = "x" * 100_000
    recipe = PAIR.replace(
        'command: ["sleep", "infinity"]\n    nodes: 4',
        f'command: ["sleep", "infinity"]\n    nodes: 4\n    env: {{BIG: "{big}"}}',
    )
    run = Run(tmp_path, recipe, "--hollow")
    try:
        run.wait_state(lambda s: up(s, 8), what="8 instances up")
        log = (run.run_dir / "logs" / "service_owner_node3.out").read_text()
        assert "service_owner_node3 attempt 0 simulated on node3" in log
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()
