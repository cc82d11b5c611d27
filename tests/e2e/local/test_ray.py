"""The `ray` kind on real processes (local backend): one cluster over a pool of 3 nodes.

Real Ray from pip (the `test` extra): the head and two members form one cluster, the fleet
gate waits for 3 ALIVE raylets, and a driver in the benchmark step runs one task pinned to
each node and sees all 3 node IPs. It works because each simulated node has its own /tmp
(Ray's session dir and sockets live in /tmp/ray). tests/e2e/local/test_node_view.py runs it with
Ray in a venv under /tmp.

The fleet gate's fail-fast case needs a member that gets ready and then exits before the
head lists it; real Ray does not do that on demand, so a stand-in `ray` program (a real
process with the same command line, dashboard endpoints and log line) plays the cluster.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance, node_ips, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(600)
def test_a_ray_pool_of_3_forms_one_cluster_and_a_driver_uses_every_node(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray[default] comes with the test extra")
    run = Run(tmp_path, (ROOT / "examples" / "ray-pool.yaml").read_text())
    # Ray on 2 shared cores takes tens of seconds to start three nodes.
    assert Run.finish(run, timeout=540, gone_within=60) == 0, run.out + run.err
    bench = (run.run_dir / "logs" / "benchmark.out").read_text()
    state = run.state()
    assert state is not None
    ips = ",".join(node_ips(state)[n] for n in ("node1", "node2", "node3"))
    assert f"ray task ips: {ips}\n" in bench, bench
    reasons = [(e["object"], e["reason"]) for e in events(run.run_dir)]
    ready = reasons.index(("service/ray", "FleetReady"))
    started = [i for i, r in enumerate(reasons) if r == ("instance/benchmark", "Launched")]
    assert started and started[0] > ready  # the gate held the benchmark until 3 were alive
    # A node is a node: each Ray node kept its session under its own /tmp (the run dir is
    # under /tmp here, so the nodes' writes were held in memory; see test_node_tmp_e2e).
    nodes = run.run_dir / "nodes"
    assert "own /tmp over the host's" in (nodes / "isolation.txt").read_text()


FAKE_RAY = """\
#!{python}
# A stand-in for `ray start`: the head serves /api/version and /nodes (1 ALIVE raylet, for
# ever) and holds the GCS port; members print Ray's line; the one on node3 exits once
# the fleet gate has polled the head ($FAKE_RAY_POLLED exists), i.e. after it was ready.
import http.server, json, os, pathlib, socket, sys, time
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
polled = pathlib.Path(os.environ["FAKE_RAY_POLLED"])
if "--head" in sys.argv:
    class Dashboard(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {{"ray_version": "fake"}}
            if self.path.startswith("/nodes"):
                body = {{"data": {{"summary": [{{"raylet": {{"state": "ALIVE"}}}}]}}}}
                polled.touch()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        def log_message(self, *args):
            pass
    ip = opts["node-ip-address"]
    gcs = socket.create_server((ip, int(opts["port"])))
    where = (opts["dashboard-host"], int(opts["dashboard-port"]))
    dashboard = http.server.HTTPServer(where, Dashboard)
    print("Ray runtime started.", flush=True)
    dashboard.serve_forever()
print("Ray runtime started.", flush=True)
if os.environ["FAKE_RAY_NODE"] == "node3":
    while not polled.exists():
        time.sleep(0.05)
    sys.exit(3)
time.sleep(100000)
"""

EXITING = """
name: ray-exit
resources: {gpus_per_node: 0}
services:
  - name: ray
    type: ray
    nodes: 3
    options: {port: 16379, dashboard_port: 18265}
    env: {FAKE_RAY_POLLED: "%s", FAKE_RAY_NODE: "{node}"}
  - name: after
    command: [sleep, "1000"]
"""


def test_a_member_that_exits_before_the_fleet_gate_passes_fails_the_job(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ray"
    fake.write_text(FAKE_RAY.format(python=os.path.realpath(sys.executable)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    # The head's mark goes in the run dir: a node's other /tmp writes are its own.
    run_dir = tmp_path / "run"
    run = Run(tmp_path, textwrap.dedent(EXITING % (run_dir / "polled")), env=env, run_dir=run_dir)
    assert Run.finish(run, timeout=120) == 1, run.out + run.err
    state = run.state()
    assert state is not None
    reason = state["job"]["reason"]
    assert reason.startswith(
        "services[ray] on node3 exited with code 3 while waiting for 3 Ray nodes to be alive ("
    ), reason
    assert reason.endswith(
        f"/3 at http://{node_ips(state)['node1']}:18265/nodes?view=summary); "
        "see logs/service_ray_node3.out"
    ), reason
    node3 = instance(state, "service_ray_node3")
    assert (node3["ready"], node3["exit_code"]) == (True, 3)  # ready first, then gone
    after = instance(state, "service_after")
    assert after["pid"] is None  # the stage never passed
    reasons = [e["reason"] for e in events(run.run_dir)]
    assert "FleetWaiting" in reasons and "FleetReady" not in reasons


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_ray_pool_of_3_forms_one_cluster_on_slurm(
    tmp_path: Path, slurm_cluster: dict[str, str]
) -> None:
    """The same pool on the SLURM test cluster: srtr allocates 3 nodes and runs each Ray node
    as an srun step there."""
    pytest.importorskip("ray", reason="ray[default] comes with the test extra")
    from tests.support import slurm_util

    # The test cluster's slurmd "nodes" share this machine's /tmp, where a real cluster's
    # nodes do not: three raylets in one session dir race for its socket names, and members
    # take the head's temp dir unless told. So each node gets a `--temp-dir` of its own
    # (short: Ray's socket paths must fit in 107 bytes).
    tmp_root = Path(tempfile.mkdtemp(prefix="srtr-ray-", dir="/tmp"))
    try:
        recipe = (ROOT / "examples" / "ray-pool.yaml").read_text()
        recipe = recipe.replace(
            "    env:\n", f'    args: ["--temp-dir={tmp_root}/{{node}}"]\n    env:\n', 1
        )
        run = Run(  # the step launcher, as this test was written for (before issue 22)
            tmp_path,
            recipe,
            "--backend",
            "slurm",
            "--launcher",
            "step",
            env=slurm_util.outside_env(),
        )
        assert Run.finish(run, timeout=540, gone_within=60) == 0, run.out + run.err
        bench = (run.run_dir / "logs" / "benchmark.out").read_text()
        # The nodes' own addresses: loopback ones on the shared-network cluster, bridge ones
        # where nodes are separate hosts.
        ips = ",".join(slurm_util.node_ip(node) for node in ("node1", "node2", "node3"))
        assert f"ray task ips: {ips}\n" in bench, bench
        assert "FleetReady" in [e["reason"] for e in events(run.run_dir)]
        for node in ("node1", "node2", "node3"):
            session = tmp_root / node / "session_latest"
            if slurm_util.separate_hosts():  # a node's /tmp is its own: look from the node
                assert slurm_util.run_on(node, ["test", "-e", str(session)]).returncode == 0, node
            else:
                assert session.exists(), node
        wait_for(lambda: slurm_util.squeue("-n", "srtr-ray-pool") == "", 60, "the job to be gone")
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
