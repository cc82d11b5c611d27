"""The SLURM test cluster's nodes are separate hosts (scripts/slurm-cluster, issue 22): each
its own hostname, address and network stack with no way off the bridge, its own /tmp that
still shows this machine's, one shared run-dir area, a link that can be cut without a FIN or
an RST, and proctrack/cgroup killing what a step leaves behind."""

from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path

import pytest
import slurm_util
from e2e_util import cmdlines_with, wait_for

pytestmark = [pytest.mark.slurm]
NODES = [f"node{k}" for k in range(1, 5)]


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_cluster: dict[str, str]) -> None:
    if not slurm_util.separate_hosts():
        pytest.skip("the SLURM test cluster shares one network (scripts/slurm-cluster --shared)")


def on(node: str, *argv: str) -> str:
    done = slurm_util.run_on(node, list(argv), cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_node_has_its_own_name_address_and_no_route_off_the_bridge() -> None:
    info = slurm_util.info()
    for node in NODES:
        ip = slurm_util.node_ip(node)
        assert on(node, "hostname").strip() == node
        assert ip in on(node, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
        assert "default" not in on(node, "ip", "route")
        # Every node and the controller's host are names in the node's /etc/hosts.
        hosts = on(node, "getent", "hosts", "node1", "node4", socket.gethostname())
        assert slurm_util.node_ip("node1") in hosts and slurm_util.node_ip("node4") in hosts
        assert info["controller_ip"] in hosts
    # SLURM sees the same: its NodeAddr is the node's own address.
    shown = subprocess.run(
        ["scontrol", "show", "node", "node2"], capture_output=True, text=True, check=True
    ).stdout
    assert f"NodeAddr={slurm_util.node_ip('node2')} " in shown
    assert "NodeHostName=node2 " in shown


def test_a_nodes_tmp_is_its_own_over_the_hosts_tmp(tmp_path: Path) -> None:
    """A node reads what this machine has in /tmp (a checkout or venv there works on the
    nodes), writes to /tmp only for itself, and shares the cluster dir's run area."""
    tag = uuid.uuid4().hex[:8]
    host_file = Path(f"/tmp/srtr-hosts-test-{tag}")
    host_file.write_text("from the host\n")
    try:
        assert on("node2", "cat", str(host_file)) == "from the host\n"
        on("node2", "sh", "-c", f"echo node2 > /tmp/srtr-node-only-{tag}")
        assert on("node2", "cat", f"/tmp/srtr-node-only-{tag}") == "node2\n"
        assert not Path(f"/tmp/srtr-node-only-{tag}").exists()
        done = slurm_util.run_on("node3", ["cat", f"/tmp/srtr-node-only-{tag}"], cwd="/")
        assert done.returncode != 0
        # The run area (tmp_path, for slurm tests) is one dir for the host and every node.
        on("node4", "sh", "-c", f"echo node4 > {tmp_path}/shared")
        assert (tmp_path / "shared").read_text() == "node4\n"
        assert on("node1", "cat", f"{tmp_path}/shared") == "node4\n"
    finally:
        host_file.unlink()


def _connect(ip: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return "connected"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__


def test_a_cut_link_drops_packets_without_a_reset_and_mends() -> None:
    """`cut` is a dead switch port: a connection to the node's slurmd neither succeeds nor
    is refused, it times out; after `mend` it connects again."""
    ip = slurm_util.node_ip("node3")
    assert _connect(ip, 6818, 5) == "connected"
    slurm_util.cut("node3")
    try:
        assert _connect(ip, 6818, 0.5) == "timeout"
    finally:
        slurm_util.mend("node3")
    wait_for(lambda: _connect(ip, 6818, 1) == "connected", 30, "node3 reachable again")


def test_proctrack_cgroup_ends_a_setsid_child_with_its_step() -> None:
    """proctrack/linuxproc lets a `setsid` child escape its step; the cgroup does not."""
    if not slurm_util.info().get("cgroups"):
        pytest.skip("this machine has no writable cgroup v1 controllers for proctrack/cgroup")
    seconds = f"1000.{uuid.uuid4().int % 10**6}"  # a command line of its own, to find it by
    done = subprocess.run(
        [
            "srun",
            "-N1",
            "-w",
            "node2",
            "bash",
            "-c",
            f"setsid sleep {seconds} & sleep 0.2; pgrep -f 'sleep {seconds}' && echo started",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_util.outside_env(),
    )
    assert done.returncode == 0 and "started" in done.stdout, done.stdout + done.stderr
    wait_for(lambda: not cmdlines_with(f"sleep {seconds}"), 30, "the setsid child killed")
