"""One mount namespace per simulated node (node_tmp.NodeTmp.enter): made by one helper while
the job starts, entered by every instance of the node with one exec, held by the controller's
fds alone (no holder process), gone with the job.

Namespaces are seen from outside through /proc: /proc/PID/ns/mnt names a process's mount
namespace, and /proc/PID/root/tmp is /tmp as that process sees it.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from srtr.backends.local.node_tmp import NodeTmp
from tests.support.e2e_util import Run, cmdlines_with, instance, wait_for

pytestmark = pytest.mark.e2e

# Three instances on each of two nodes; each leaves a file named after itself in its /tmp.
NODES = """
name: nodens
services:
  - name: box
    nodes: 2
    command: [bash, -c, 'touch /tmp/$SRTR_INSTANCE && echo serving && exec sleep 1000']
    readiness: {log: {pattern: "^serving$"}, timeout_seconds: 60, interval_seconds: 0.05}
  - name: ridera
    command: [bash, -c, 'touch /tmp/$SRTR_INSTANCE && exec sleep 1000']
    placement: {pool: box}
    restart: {backoff_seconds: 0.1}
  - name: riderb
    command: [bash, -c, 'touch /tmp/$SRTR_INSTANCE && exec sleep 1000']
    placement: {pool: box}
"""

UP = ("Running", "Ready")
NODE1 = {"service_box_node1", "service_ridera_node1", "service_riderb_node1"}
NODE2 = {"service_box_node2", "service_ridera_node2", "service_riderb_node2"}


def _running(run: Run) -> dict[str, Any]:
    return run.wait_state(
        lambda s: (
            s["job"]["phase"] == "Running"
            and all(i["phase"] in UP and i["identity"] for i in s["instances"])
        ),
        60,
        "every instance Running",
    )


def _pids(state: dict[str, Any]) -> dict[str, int]:
    return {i["name"]: i["pid"] for i in state["instances"]}


# fds of every namespace a test looked at: the kernel reuses the number of a freed namespace,
# so a namespace is kept (open, no process in it) until the test ends, to compare names.
_PINNED: list[int] = []


@pytest.fixture(autouse=True)
def _unpin() -> Iterator[None]:
    yield
    while _PINNED:
        os.close(_PINNED.pop())


def _ns(pid: int) -> str:
    """The name of `pid`'s mount namespace (kept from reuse until the test ends)."""
    _PINNED.append(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
    return os.readlink(f"/proc/{pid}/ns/mnt")


def _tmp_seen_by(pid: int) -> set[str]:
    """What `pid`'s node wrote under its /tmp: what it sees there that the host has not."""
    return set(os.listdir(f"/proc/{pid}/root/tmp")) - set(os.listdir("/tmp"))


def _members(namespaces: set[str]) -> set[int]:
    """Pids of the live processes in any of `namespaces`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "mnt") in namespaces:
                stat = (entry / "stat").read_text()
                if ") Z " not in stat:
                    found.add(int(entry.name))
        except OSError:
            continue
    return found


def _stop(run: Run) -> int:
    """SIGINT `srtr up` (if it still runs) and wait for it and all its processes to end."""
    if run.proc.poll() is None:
        run.signal(signal.SIGINT)
    return run.finish(timeout=60)


def _files_written(pids: dict[str, int]) -> bool:
    return all(name in _tmp_seen_by(pid) for name, pid in pids.items())


def test_a_node_is_one_namespace_entered_by_each_instance(tmp_path: Path) -> None:
    run = Run(tmp_path, NODES)
    try:
        pids = _pids(_running(run))
        wait_for(lambda: _files_written(pids), 30, "each instance's file in its /tmp")
        ns1 = {_ns(pids[name]) for name in NODE1}
        ns2 = {_ns(pids[name]) for name in NODE2}
        # One namespace per node, each the node's own and not the controller's.
        assert len(ns1) == 1 and len(ns2) == 1 and ns1 != ns2
        assert _ns(os.getpid()) not in ns1 | ns2
        # Instances of a node see each other's files, never the other node's.
        for name in NODE1:
            assert _tmp_seen_by(pids[name]) >= NODE1 and not _tmp_seen_by(pids[name]) & NODE2
        for name in NODE2:
            assert _tmp_seen_by(pids[name]) >= NODE2 and not _tmp_seen_by(pids[name]) & NODE1
        # Nothing but the instances lives in the namespaces: no holder, no maker left.
        assert _members(ns1) == {pids[name] for name in NODE1}
        assert _members(ns2) == {pids[name] for name in NODE2}
        for pid in pids.values():
            # nsenter exec'd: the pid is the program's own, and it kept srtr's cwd.
            assert Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001000\x00"
            assert os.readlink(f"/proc/{pid}/cwd") == os.getcwd()
        # A relaunched rider enters its node's namespace again.
        os.kill(pids["service_ridera_node1"], signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_ridera_node1")["restarts"] == 1
                and instance(s, "service_ridera_node1")["phase"] in UP
            ),
            30,
            "the rider to be relaunched",
        )
        assert _ns(instance(state, "service_ridera_node1")["pid"]) in ns1
    finally:
        code = _stop(run)
    assert code == 130, run.out + run.err
    # The namespaces ended with the job: no process is left in them.
    assert _members(ns1 | ns2) == set()


SOLO = """
name: nodens
services:
  - name: solo
    command: [bash, -c, 'echo $$ >> /tmp/pids && exec sleep 1000']
    restart: {backoff_seconds: 0.1}
"""


def test_a_namespace_outlives_its_last_process_while_the_controller_runs(
    tmp_path: Path,
) -> None:
    """The node's only instance dies: its relaunch finds the same namespace and files, kept
    by the controller's fd alone."""
    run = Run(tmp_path, SOLO)
    try:
        first = _pids(_running(run))["service_solo"]
        namespace = _ns(first)
        wait_for(lambda: "pids" in _tmp_seen_by(first), 30, "the first attempt's file")
        os.kill(first, signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_solo")["restarts"] == 1
                and instance(s, "service_solo")["phase"] in UP
            ),
            30,
            "the relaunch",
        )
        second = instance(state, "service_solo")["pid"]
        assert second != first and _ns(second) == namespace
        pids_file = Path(f"/proc/{second}/root/tmp/pids")
        wait_for(lambda: pids_file.read_text() == f"{first}\n{second}\n", 30, "both pids")
    finally:
        code = _stop(run)
    assert code == 130, run.out + run.err
    assert _members({namespace}) == set()


def test_nothing_outlives_a_killed_controller_but_its_instances(tmp_path: Path) -> None:
    """kill -9 of `srtr up`: its instances stay in their namespaces for the adoption window,
    nothing else is in them; then the guard kills the instances and the namespaces are gone."""
    run = Run(tmp_path, NODES, "--adopt-window", "1")
    try:
        pids = _pids(_running(run))
        namespaces = {_ns(pid) for pid in pids.values()}
        run.proc.kill()
        run.wait(30)
        assert _members(namespaces) <= set(pids.values())
        wait_for(lambda: not _members(namespaces), 30, "no process left in the namespaces")
    finally:
        run.close()


def test_launches_after_adoption_see_the_same_node_files(tmp_path: Path) -> None:
    """Adopted instances keep their namespace, and an instance the new controller starts
    on their node joins it."""
    run = Run(tmp_path, NODES, "--adopt-window", "60")
    try:
        pids = _pids(_running(run))
        wait_for(lambda: _files_written(pids), 30, "each instance's file in its /tmp")
        old = _ns(pids["service_box_node1"])
        run.proc.kill()
        run.wait(30)
        second = run.adopt()
        run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and s["job"]["phase"] in UP,
            30,
            "the new controller to take over",
        )
        os.kill(pids["service_ridera_node1"], signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_ridera_node1")["restarts"] == 1
                and instance(s, "service_ridera_node1")["phase"] in UP
            ),
            30,
            "the adopted rider to be relaunched",
        )
        new = instance(state, "service_ridera_node1")["pid"]
        assert _ns(new) == old and _ns(pids["service_box_node1"]) == old
        assert _tmp_seen_by(new) >= NODE1 and not _tmp_seen_by(new) & NODE2
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")


TMPDIR_NODES = """
name: nodens
services:
  - name: box
    nodes: 2
    command: [bash, -c, 'touch "$TMPDIR/$SRTR_INSTANCE" && echo serving && exec sleep 1000']
    readiness: {log: {pattern: "^serving$"}, timeout_seconds: 60, interval_seconds: 0.05}
"""


def test_an_nsenter_that_fails_leaves_the_nodes_tmpdir_only(tmp_path: Path) -> None:
    # An `nsenter` that always fails: one warning, and the nodes get TMPDIR (no view).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    refuse = bin_dir / "nsenter"
    refuse.write_text("#!/bin/sh\necho 'nsenter: reassociate to namespace failed' >&2\nexit 1\n")
    refuse.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = Run(tmp_path, TMPDIR_NODES, env=env)
    try:
        pids = _pids(_running(run))
        nodes = run.run_dir / "nodes"
        for name, pid in pids.items():
            node = name.rsplit("_", 1)[1]
            wait_for(lambda n=node, i=name: (nodes / n / "tmp" / i).exists(), 30, "its file")
            assert _ns(pid) == _ns(os.getpid())  # no view: the host's namespace
    finally:
        code = _stop(run)
    assert code == 130, run.out + run.err
    log = (run.run_dir / "logs" / "srtr.log").read_text()
    assert log.count("nsenter cannot enter a node's view") == 1, log
    assert "reassociate to namespace failed" in log
    assert (nodes / "isolation.txt").read_text().startswith("node isolation: TMPDIR only; nsenter")


def _helpers() -> list[int]:
    """Live node-view helpers started by this test process."""
    me = str(os.getpid())
    found = []
    for pid, _ in cmdlines_with("backends/local/node_view.py"):
        with_parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if with_parent[1] == me and with_parent[0] != "Z":
            found.append(pid)
    return found


def test_one_helper_makes_every_view_and_is_gone_once_done(tmp_path: Path) -> None:
    """No process per node and none left: the helper exits once the views are made, and a
    view lives on in the controller's fd (the instance finds its node's file again)."""
    node_tmp = NodeTmp(tmp_path / "nodes", [f"node{k}" for k in range(1, 9)])
    try:
        argv = node_tmp.enter("node8", ["sh", "-c", "echo mine > /tmp/mine"])
        assert argv[0].endswith("nsenter")
        assert subprocess.run(argv, check=False).returncode == 0
        wait_for(lambda: not _helpers(), 30, "the helper to exit")
        again = node_tmp.enter("node8", ["cat", "/tmp/mine"])
        assert subprocess.run(again, capture_output=True, text=True).stdout == "mine\n"
        other = node_tmp.enter("node1", ["sh", "-c", "test ! -e /tmp/mine && echo absent"])
        assert subprocess.run(other, capture_output=True, text=True).stdout == "absent\n"
    finally:
        node_tmp.close()


def test_a_view_is_made_when_the_controller_has_over_1024_fds(tmp_path: Path) -> None:
    """A controller of thousands of instances holds a pidfd each: the views' socket then
    gets an fd number above select()'s limit of 1023."""
    low, high = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(low, min(high, 2048)), high))
    with open(os.devnull) as null:
        taken = [os.dup(null.fileno()) for _ in range(1100)]
    try:
        assert max(taken) > 1024
        node_tmp = NodeTmp(tmp_path / "nodes", ["node1"])
        argv = node_tmp.enter("node1", ["sh", "-c", "echo here > /tmp/mine && cat /tmp/mine"])
        assert argv[0].endswith("nsenter")
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert done.stdout == "here\n"
        assert not Path("/tmp/mine").exists() or Path("/tmp/mine").read_text() != "here\n"
        node_tmp.close()
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, high))


AS_USER = """
import subprocess, sys
from pathlib import Path
from srtr.backends.local.node_tmp import NodeTmp

root = Path(sys.argv[1])
node_tmp = NodeTmp(root, ["node1", "node2"])
mine = sys.argv[2]
script = f"id -u; echo node1 > {mine}; cat {mine}; cat {sys.argv[3]}"
write = node_tmp.enter("node1", ["sh", "-c", script])
other = node_tmp.enter("node2", ["sh", "-c", f"test -e {mine} || echo absent"])
print(write[0].rsplit("/", 1)[-1], (root / "isolation.txt").read_text().strip(), flush=True)
subprocess.run(write, check=True)
subprocess.run(other, check=True)
node_tmp.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to an unprivileged user with setpriv")
def test_an_unprivileged_user_gets_node_views_through_a_user_namespace(tmp_path: Path) -> None:
    """Without root the helper first enters one user namespace (root in it, as `unshare
    --map-root-user`); the nodes' instances enter it with their node's view."""
    # The user must be able to run the interpreter: the test's may live under /root.
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin")
    if shutil.which("setpriv") is None or python is None:
        pytest.skip("setpriv (util-linux) or a system python3 is not installed")
    where = Path(tempfile.mkdtemp(prefix="srtr-userns-", dir="/tmp"))
    try:
        where.chmod(0o777)
        host = where / "host-file"
        host.write_text("host data\n")
        host.chmod(0o644)
        mine = f"/tmp/srtr-userns-x-{os.getpid()}"
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
        done = subprocess.run(
            [*drop, python, "-c", AS_USER, str(where / "nodes"), mine, str(host)],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == [
            "nsenter node isolation: own /tmp over the host's (overlay in a mount namespace), "
            "TMPDIR=/tmp",
            "0",  # root in the job's user namespace
            "node1",
            "host data",
            "absent",
        ], done.stdout + done.stderr
        assert not Path(mine).exists()
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs under /tmp on the host")
def test_a_filesystem_mounted_under_tmp_is_visible_on_every_node(tmp_path: Path) -> None:
    """An overlay's lower layer hides the mounts beneath it: those under /tmp are bound back."""
    where = Path(tempfile.mkdtemp(prefix="srtr-submount-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "srtr-test", str(where)], check=True)
    try:
        (where / "on-the-mount").write_text("mounted\n")
        node_tmp = NodeTmp(tmp_path / "nodes", ["node1"])
        try:
            argv = node_tmp.enter("node1", ["cat", str(where / "on-the-mount")])
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            assert done.stdout == "mounted\n", done.stderr
        finally:
            node_tmp.close()
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()
