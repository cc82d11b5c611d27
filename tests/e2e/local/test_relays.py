"""Relays with real agent processes (`srtr up --launcher agent`, 20 local nodes: 4 groups of
5): members' sockets leave the controller's epoll; a frozen relay (SIGSTOP) costs its
members a switch back to direct watching and nobody's loss but its own; a frozen member is
lost by its own silence."""

from __future__ import annotations

import functools
import os
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.local.test_agent import agent_pids, running
from tests.support.e2e_util import Run, events, wait_for

pytestmark = pytest.mark.e2e
AGENT = ("--launcher", "agent")
NODES = 20
POOL = f"""
name: relays
services:
  - name: pool
    command: ["sleep", "1000"]
    nodes: {NODES}
"""
SPEAKS = re.compile(r"the relay on (node\d+) speaks for (\d+) of its group's (\d+) nodes")
finish = functools.partial(Run.finish, gone_within=10.0)


def _log(run: Run) -> str:
    path = run.run_dir / "logs" / "srtr.log"
    return path.read_text() if path.exists() else ""


def _speaking(run: Run) -> list[tuple[str, int, int]]:
    return [(m[1], int(m[2]), int(m[3])) for m in SPEAKS.finditer(_log(run))]


def _lost(run: Run) -> set[str]:
    """The nodes of the NodeLost events so far (one instance each here)."""
    return {e["object"].rsplit("_", 1)[1] for e in events(run.run_dir) if e["reason"] == "NodeLost"}


def test_a_frozen_relay_loses_only_itself_and_a_frozen_member_is_lost(tmp_path: Path) -> None:
    run = Run(tmp_path, POOL, *AGENT, "--nodes", str(NODES))
    stopped: list[int] = []
    try:
        run.wait_state(running, what="every instance running")
        # Every group's relay speaks for its other 4 nodes: their sockets left the epoll.
        first = wait_for(lambda: len(_speaking(run)) >= 4 and _speaking(run), what="4 relays")
        assert all(count >= 1 and size == 5 for _, count, size in first)
        relays = {node for node, _, _ in first}
        relay = sorted(relays)[0]
        group = (int(relay.removeprefix("node")) - 1) // 5
        pids = agent_pids(run)
        os.kill(pids[relay], signal.SIGSTOP)
        stopped.append(pids[relay])
        wait_for(lambda: relay in _lost(run), timeout=10, what=f"{relay} lost")
        # Its members are watched directly again; another of them relays for the group.
        members = {f"node{group * 5 + k}" for k in range(1, 6)} - {relay}
        wait_for(
            lambda: any(node in members for node, _, _ in _speaking(run)),
            timeout=20,
            what="a new relay for the frozen relay's group",
        )
        assert _lost(run) == {relay}, _log(run)
        other = (group + 1) % 4  # a member of another group
        member = next(
            f"node{other * 5 + k}" for k in range(1, 6) if f"node{other * 5 + k}" not in relays
        )
        os.kill(pids[member], signal.SIGSTOP)
        stopped.append(pids[member])
        wait_for(lambda: member in _lost(run), timeout=10, what=f"{member} lost")
        assert _lost(run) == {relay, member}
        log = _log(run)
        assert f"node {member} was lost: its agent was silent" in log
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        run.signal(signal.SIGTERM)
        try:
            assert finish(run) == 143, run.out + run.err
        finally:
            run.close()
