"""Pools that outgrow the allocation, end to end on the local backend (issue 24): `srtr up`
asks the simulated provider for the nodes a live edit needs, the pool waits for them, its
owners and riders launch there once they joined, and a shrink gives them back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e_util import Run, cmdlines_with, events, wait_for

pytestmark = pytest.mark.e2e

RECIPE = """\
    name: grow
    services:
      - name: fleet
        command: ["sleep", "infinity"]
        nodes: {nodes}
      - name: agent
        command: ["python3", "-m", "http.server", "9930", "--bind", "{{node_ip}}"]
        placement: {{pool: fleet}}
        readiness:
          http: {{port: 9930, path: /}}
          timeout_seconds: 30
    {extra}"""


def recipe(nodes: int, extra: str = "") -> str:
    return RECIPE.format(nodes=nodes, extra=extra)


def save(run: Run, nodes: int, extra: str = "") -> None:
    """A live edit as an editor saves it (the whole file again)."""
    run.recipe.write_text(textwrap.dedent(recipe(nodes, extra)))


def env(**more: str) -> dict[str, str]:
    return {**os.environ, **more}


def pool(state: dict[str, Any]) -> dict[str, Any]:
    return state["pools"][0]


def ready(state: dict[str, Any], names: list[str]) -> bool:
    by_name = {i["name"]: i for i in state["instances"]}
    return all(n in by_name and by_name[n]["ready"] for n in names)


def reasons(run: Run) -> list[str]:
    return [e["reason"] for e in events(run.run_dir)]


def status(run: Run) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run.run_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env(COLUMNS="250"),
    )
    return done.stdout


@pytest.mark.parametrize("launcher", ["process", "agent"])
def test_a_pool_grows_past_the_allocation_and_gives_the_nodes_back(
    tmp_path: Path, launcher: str
) -> None:
    run = Run(
        tmp_path,
        recipe(2),
        "--launcher",
        launcher,
        env=env(SRTR_LOCAL_PROVISION_DELAY="2"),
    )
    try:
        first = ["service_agent_node1", "service_agent_node2"]
        run.wait_state(lambda s: ready(s, first), what="the first riders ready")
        save(run, 4)
        # The pool waits for the nodes, and says for what, in state.json and srtr status.
        waiting = run.wait_state(lambda s: pool(s).get("pending"), what="the pool pending")
        assert pool(waiting)["pending"].startswith("waiting for 2 node(s) from local (request ")
        assert "Pending: waiting for 2 node(s) from local" in status(run)
        assert [r["phase"] for r in waiting["grow"]["requests"]] == ["Pending"]
        # Nothing ran yet on nodes the job does not have.
        assert [n["name"] for n in waiting["nodes"]] == ["node1", "node2"]

        new = ["service_agent_node3", "service_agent_node4"]
        grown = run.wait_state(lambda s: ready(s, new), what="riders on the new nodes")
        assert pool(grown)["nodes"] == ["node1", "node2", "node3", "node4"]
        assert pool(grown)["pending"] is None
        assert grown["grow"]["provisioned"] == ["node3", "node4"]
        assert [r["phase"] for r in grown["grow"]["requests"]] == ["Granted"]
        seen = events(run.run_dir)
        order = [e["reason"] for e in seen]
        assert order.index("GrowRequested") < order.index("NodesJoined")
        assert order.index("NodesJoined") < order.index("RecipeApplied")
        # Usual launch order on the new nodes: the owners first, the riders after them.
        launched = [e["object"] for e in seen if e["reason"] == "Launched"]
        assert launched.index("instance/service_fleet_node3") < launched.index(
            "instance/service_agent_node3"
        )

        save(run, 2)
        shrunk = run.wait_state(
            lambda s: [n["name"] for n in s["nodes"]] == ["node1", "node2"],
            what="the provisioned nodes gone from the allocation",
        )
        assert pool(shrunk)["nodes"] == ["node1", "node2"]
        assert shrunk["grow"]["provisioned"] == []
        assert [r["phase"] for r in shrunk["grow"]["requests"]] == ["Released"]
        # Each node goes back once nothing runs there: one event, or one per node when
        # node3's instances stopped before node4's.
        released = [e for e in events(run.run_dir) if e["reason"] == "NodesReleased"]
        messages = [e["message"] for e in released]
        where = "back to local (request grow-grow-1)"
        assert messages in (
            [f"gave node3, node4 {where}"],
            [f"gave node3 {where}", f"gave node4 {where}"],
            [f"gave node4 {where}", f"gave node3 {where}"],
        ), messages
        # The instances on them were stopped first: nothing of the run runs there.
        stopped = {e["object"] for e in events(run.run_dir) if e["reason"] == "Stopped"}
        assert {"instance/service_fleet_node3", "instance/service_agent_node4"} <= stopped
        if launcher == "agent":  # the released nodes' agents ended, the others did not
            wait_for(lambda: _agent_gone(run, "node3"), 20, "the agent of node3 to end")
            assert not _agent_gone(run, "node1")
        # Growing again is a new request, for new nodes: the released ones stay gone (a
        # stale grant once joined them back at once, with nothing asked).
        save(run, 3)
        again = run.wait_state(lambda s: ready(s, ["service_agent_node5"]), what="a regrow")
        assert again["grow"]["provisioned"] == ["node5"]
        assert reasons(run).count("NodesJoined") == 2
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()


def test_a_request_granted_at_once_joins(tmp_path: Path) -> None:
    # A provider with free nodes at hand grants inside the request itself: the nodes must
    # still join (they once stayed granted and unused for ever).
    run = Run(tmp_path, recipe(2), env=env(SRTR_LOCAL_PROVISION_DELAY="0"))
    try:
        run.wait_state(lambda s: ready(s, ["service_agent_node1"]), what="the first riders")
        save(run, 3)
        grown = run.wait_state(
            lambda s: ready(s, ["service_agent_node3"]), what="the rider on the new node"
        )
        assert grown["grow"]["provisioned"] == ["node3"]
        assert reasons(run).count("NodesJoined") == 1
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()


def _agent_gone(run: Run, node: str) -> bool:
    """No agent of this run serves `node` (other runs' agents have nodes of that name)."""
    mine = str(run.run_dir.resolve())
    agents = [c for _, c in cmdlines_with("srtr.backends.agent.node") if mine in c]
    return not [c for c in agents if f"--node {node} " in c]


def test_saving_the_size_back_cancels_a_pending_request(tmp_path: Path) -> None:
    run = Run(tmp_path, recipe(2), env=env(SRTR_LOCAL_PROVISION_DELAY="600"))
    try:
        run.wait_state(lambda s: ready(s, ["service_agent_node2"]), what="riders ready")
        save(run, 3)
        run.wait_state(lambda s: pool(s).get("pending"), what="the pool pending")
        save(run, 2)
        back = run.wait_state(
            lambda s: [r["phase"] for r in s["grow"]["requests"]] == ["Cancelled"],
            what="the request cancelled",
        )
        assert pool(back)["pending"] is None
        assert [n["name"] for n in back["nodes"]] == ["node1", "node2"]
        cancelled = [e for e in events(run.run_dir) if e["reason"] == "GrowCancelled"]
        assert cancelled[0]["message"] == (
            "local request grow-grow-1: the recipe no longer needs them"
        )
        assert back["job"]["generation"] == 1  # nothing was rolled out
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()


def test_a_request_the_provider_refuses_is_a_rejected_edit_and_touches_nothing(
    tmp_path: Path,
) -> None:
    refusal = "QOSMaxNodePerUserLimit (simulated)"
    run = Run(tmp_path, recipe(2), env=env(SRTR_LOCAL_PROVISION_REFUSE=refusal))
    try:
        run.wait_state(lambda s: ready(s, ["service_agent_node2"]), what="riders ready")
        pids = {i["name"]: i["pid"] for i in run.state()["instances"]}  # type: ignore[index]
        save(run, 3)
        rejected = run.wait_state(lambda s: s["recipe"].get("rejected"), what="the edit rejected")
        lines = rejected["recipe"]["rejected"]
        assert lines[-1] == f"local: {refusal}"
        assert "pool fleet would grow past the allocation: it needs 1 more node(s)" in lines[0]
        assert lines[0].startswith(f"{run.recipe}:")  # FILE:LINE: of the pool's nodes
        assert {i["name"]: i["pid"] for i in rejected["instances"]} == pids
        assert "RecipeRejected" in reasons(run)
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()


def test_grow_never_refuses_an_edit_past_the_spares(tmp_path: Path) -> None:
    run = Run(tmp_path, recipe(2, "resources: {grow: never}"))
    try:
        run.wait_state(lambda s: ready(s, ["service_agent_node2"]), what="riders ready")
        save(run, 3, "resources: {grow: never}")
        rejected = run.wait_state(lambda s: s["recipe"].get("rejected"), what="rejected")
        assert rejected["recipe"]["rejected"][0].endswith(
            "pool fleet would grow past the allocation: it needs 1 more node(s) and 0 are spare"
        )
        assert "grow" not in rejected  # no provider: nothing to record
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()


def test_a_bad_provision_delay_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(recipe(2)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "srtr",
            "up",
            str(path),
            "--headless",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(SRTR_LOCAL_PROVISION_DELAY="soon"),
    )
    assert done.returncode == 2, done.stderr
    assert "SRTR_LOCAL_PROVISION_DELAY must be a number of seconds; got 'soon'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was made
