"""Local jobs have networks of their own: two jobs of one recipe that listen on the same
fixed port on every node run side by side, each on its own loopback block, and the nodes of
each still reach each other; a job whose controller crashed keeps its block until it is
adopted, and after."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, wait_for

pytestmark = pytest.mark.e2e

PORT = 18777
# The owner serves on the fixed port of its node's address; the rider on every node fetches
# from instance 0 of the pool, another node of the same job, on that port.
FIXED = f"""
name: fixed-port
resources: {{gpus_per_node: 0}}
services:
  - name: web
    nodes: 2
    command: [python3, -m, http.server, "{PORT}", --bind, "{{node_ip}}"]
    readiness: {{http: {{port: {PORT}, path: /}}, timeout_seconds: 30, interval_seconds: 0.2}}
  - name: peer
    placement: {{pool: web}}
    start: after_frontend
    command:
      - python3
      - -c
      - |
        import time, urllib.request
        urllib.request.urlopen("http://{{pool_ip}}:{PORT}/", timeout=10).read()
        print("reached {{pool_ip}} from {{node_ip}}", flush=True)
        time.sleep(1000)
    readiness: {{log: {{pattern: reached}}, timeout_seconds: 30, interval_seconds: 0.2}}
"""


def running(run: Run) -> dict:
    return run.wait_state(
        lambda s: (
            s["job"]["phase"] == "Running" and all(i["phase"] == "Ready" for i in s["instances"])
        ),
        60,
        "every instance ready",
    )


def fetch(ip: str) -> int:
    with urllib.request.urlopen(f"http://{ip}:{PORT}/", timeout=10) as answer:
        return int(answer.status)


def test_two_jobs_with_a_fixed_port_on_every_node_run_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Run(tmp_path / "a", FIXED)
    second = None
    try:
        one = running(first)
        second = Run(tmp_path / "b", FIXED)
        two = running(second)
        assert one["job"]["network"] != two["job"]["network"]
        ips = [{n["ip"] for n in state["nodes"]} for state in (one, two)]
        assert not ips[0] & ips[1]
        for state in (one, two):
            prefix = state["job"]["network"].split(".0.0/16")[0] + "."
            assert all(n["ip"].startswith(prefix) for n in state["nodes"])
            # each node's server answers on the one port, on its own job's address
            assert all(fetch(n["ip"]) == 200 for n in state["nodes"])
        logs = (second.run_dir / "logs" / "service_peer_node2.out").read_text()
        pool_ip = two["nodes"][0]["ip"]
        assert f"reached {pool_ip} from {two['nodes'][1]['ip']}" in logs
    finally:
        for run in (first, second):
            if run is not None:
                run.signal()
        for run in (first, second):
            if run is not None:
                assert run.finish(60) == 130, run.err


def test_a_crashed_job_keeps_its_block_through_adoption(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    crashed = Run(tmp_path / "a", FIXED, "--adopt-window", "60")
    other = None
    try:
        block = running(crashed)["job"]["network"]
        crashed.proc.kill()  # kill -9: its guard holds the block while it can be adopted
        crashed.wait(30)
        other = Run(tmp_path / "b", FIXED)
        assert running(other)["job"]["network"] != block
        second = crashed.adopt()
        state = crashed.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and s["job"]["phase"] == "Running",
            30,
            "the new controller to take over",
        )
        assert state["job"]["network"] == block
        assert all(i["restarts"] == 0 for i in state["instances"])
        second.send_signal(2)
        assert second.wait(60) == 130
    finally:
        if other is not None:
            other.signal()
            other.finish(60)
        crashed.close()
    wait_for(lambda: not crashed.leftovers(), 15, "every process of the crashed run to be gone")
