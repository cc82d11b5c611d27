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

from tests.support import slurm_util
from tests.support.e2e_util import cmdlines_with, wait_for

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


def test_another_dir_on_the_same_subnet_neither_takes_nor_tears_down_the_cluster(
    tmp_path: Path,
) -> None:
    """`down` of a dir with no cluster of its own, or `up` of one that would reuse this
    cluster's subnet, must leave the running cluster's nodes alone."""
    info = slurm_util.info()
    env = {
        **slurm_util.outside_env(),
        "SRTR_SLURM_DIR": str(tmp_path / "other"),
        "SRTR_SLURM_SUBNET": info["subnet"],
    }
    (tmp_path / "other").mkdir()
    script = str(slurm_util.CLUSTER)
    down = subprocess.run([script, "down"], env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    up = subprocess.run([script, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert up.returncode == 1 and f"is used by the cluster in {info['dir']}" in up.stderr
    for node in NODES:
        assert on(node, "hostname").strip() == node


def test_down_removes_every_trace_of_a_cluster_of_its_own(tmp_path: Path) -> None:
    """A 2-node cluster of the test's own (own dir, port and subnet): `down` with a job
    running exits 0 and leaves no process, namespace, veth, bridge or owner file."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    octet = 200 + port % 50
    env = {
        **slurm_util.outside_env(),
        "SRTR_SLURM_DIR": str(tmp_path / "own"),
        "SRTR_SLURM_CTLD_PORT": str(port),
        "SRTR_SLURM_SUBNET": f"10.77.{octet}",
        "SLURM_CONF": str(tmp_path / "own" / "slurm.conf"),
    }
    tag = f"77{octet:03d}"
    script = str(slurm_util.CLUSTER)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    up = run(script, "up", "--nodes", "2")
    assert up.returncode == 0, up.stderr
    sleeper = subprocess.Popen(["srun", "-N2", "sleep", "1000"], env=env)
    try:
        wait_for(lambda: run("squeue", "-h", "-t", "R").stdout.strip(), 30, "the job running")
        down = run(script, "down")
        assert down.returncode == 0 and "down (" in down.stderr, down.stderr
        sleeper.wait(30)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert f"srn{tag}-" not in run("ip", "netns", "list").stdout
    links = run("ip", "-o", "link", "show").stdout
    assert f"srv{tag}-" not in links and f"srb{tag}" not in links
    assert not Path(f"/run/srtr-slurm-net-{tag}.dir").exists()
    assert not cmdlines_with(str(tmp_path / "own" / "slurm.conf"))
