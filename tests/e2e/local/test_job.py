"""End to end on the local backend: real `srtr up` processes running real instances."""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]


finish = functools.partial(Run.finish, gone_within=10.0)

# The tests that matter run under both local launchers: a process group per instance, and a
# node agent per simulated node (issue 15; the agent's own tests: tests/e2e/local/test_agent.py).
LAUNCHERS = pytest.mark.parametrize("launcher", ["process", "agent"])


def test_seed_pools_recipe_runs_and_writes_the_seed_logs(tmp_path: Path) -> None:
    recipe = (ROOT / "examples" / "pools.yaml").read_text()
    run = Run(tmp_path, recipe)
    code = finish(run)
    assert code == 0, run.err
    logs = sorted(p.name for p in (run.run_dir / "logs").iterdir())
    for name in (
        "service_train_node2.out",
        "service_train_node3.out",
        "service_napper.out",
        "service_watcher_node2.out",
        "service_watcher_node3.out",
        "benchmark.out",
        "srtr.log",
    ):
        assert name in logs
    assert (run.run_dir / "logs" / "benchmark.out").read_text() == "train pool: node2,node3\n"
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Succeeded"
    assert (run.run_dir / "recipe.yaml").read_text() == run.recipe.read_text()
    reasons = [e["reason"] for e in events(run.run_dir)]
    assert reasons.count("PoolReady") == 2
    assert reasons[-1] == "JobSucceeded"
    assert "Launched" in run.out


TERMINAL = """
name: term
services:
  - name: train
    command: ["bash", "-c", "if [ {index} = 1 ]; then exit 3; fi; exit 0"]
    nodes: 2
    terminal: true
  - name: side
    command: ["sleep", "1000"]
    placement: {pool: train}
"""


@LAUNCHERS
def test_terminal_pool_ends_the_job_with_the_failed_members_code(
    tmp_path: Path, launcher: str
) -> None:
    run = Run(tmp_path, TERMINAL, "--launcher", launcher)
    assert finish(run) == 3
    state = run.state()
    assert state is not None
    assert instance(state, "service_train_node1")["exit_code"] == 0
    assert instance(state, "service_train_node2")["exit_code"] == 3
    assert instance(state, "service_side_node1")["phase"] == "Stopped"
    assert "first failed: service_train_node2 on node2, exit code 3" in state["job"]["reason"]


FDS = """
name: fds
services:
  - name: side
    command: ["sleep", "1000"]
    nodes: 2
  - name: look
    # grep shows the dispositions srtr's child got (bash keeps ignored signals ignored).
    preamble: grep SigIgn /proc/self/status
    command:
      - python3
      - -c
      - |
        import os
        # What is still open once listdir's own fd is closed came from the parent.
        fds = [f for f in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{f}")]
        print("fds", *sorted(fds, key=int))
        print("session", os.getsid(0) == os.getpid())
    nodes: 1
    terminal: true
"""


@LAUNCHERS
def test_an_instance_inherits_no_fd_of_the_controller_and_default_signals(
    tmp_path: Path, launcher: str
) -> None:
    """The controller holds pidfds, sockets, logs, node views and what its own parent left
    open: none may reach an instance (an inherited socket keeps a port or a connection
    alive after srtr), and SIGPIPE and SIGXFSZ are the default again, as Popen leaves them
    (Python ignores SIGPIPE; a pipeline in an instance must die of it, as in a shell)."""
    # srtr up starts with fd 7 open and inheritable, as a shell or a batch system may leave one.
    leaky = ("sh", "-c", 'exec 7</dev/null; exec "$@"', "sh")
    run = Run(tmp_path, FDS, "--launcher", launcher, prefix=leaky)
    assert finish(run) == 0, run.err
    ignored, fds, session = (run.run_dir / "logs" / "service_look.out").read_text().splitlines()
    mask = int(ignored.split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1)) and not mask & (1 << (signal.SIGXFSZ - 1))
    assert fds == "fds 0 1 2"
    assert session == "session True"


RIDER = """
name: riders
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
  - name: rider
    command: ["sleep", "1000"]
    placement: {pool: owner}
    restart: {backoff_seconds: 0.1}
"""


@LAUNCHERS
def test_killed_rider_is_restarted_and_shows_it(tmp_path: Path, launcher: str) -> None:
    run = Run(tmp_path, RIDER, "--launcher", launcher)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        victim = instance(state, "service_rider_node2")
        os.kill(victim["pid"], signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, "service_rider_node2")["restarts"] == 1
                and instance(s, "service_rider_node2")["phase"] == "Running"
            ),
            what="rider restarted",
        )
        assert instance(state, "service_rider_node2")["pid"] != victim["pid"]
        reasons = [(e["reason"], e["object"]) for e in events(run.run_dir)]
        assert ("BackOff", "instance/service_rider_node2") in reasons
        assert ("Restarting", "instance/service_rider_node2") in reasons
        exits = [
            e["message"]
            for e in events(run.run_dir)
            if (e["reason"], e["object"]) == ("Exited", "instance/service_rider_node2")
        ]
        assert exits and "signal 9" in exits[0], exits
        log = (run.run_dir / "logs" / "service_rider_node2.out").read_text()
        assert "attempt 1 starting on node2" in log
        run.signal(signal.SIGINT)
        assert finish(run) == 130
    finally:
        run.close()


CRITICAL = """
name: crit
services:
  - name: db
    command: ["bash", "-c", "sleep 0.5; exit 3"]
    critical: true
  - name: app
    command: ["sleep", "1000"]
    start: before_workers
"""


@LAUNCHERS
def test_critical_exit_fails_the_job_and_tears_everything_down(
    tmp_path: Path, launcher: str
) -> None:
    run = Run(tmp_path, CRITICAL, "--launcher", launcher)
    assert finish(run) == 1
    state = run.state()
    assert state is not None
    assert state["job"]["phase"] == "Failed" and state["job"]["launcher"] == launcher
    assert instance(state, "service_db")["exit_code"] == 3
    assert instance(state, "service_app")["phase"] == "Stopped"
    assert "critical instance service_db" in state["job"]["reason"]


STUBBORN = """
name: stubborn
services:
  - name: deaf
    command: ["bash", "-c", "trap '' TERM; echo trapped; while true; do sleep 0.1; done"]
    stop_grace_seconds: 0.5
    readiness: {log: {pattern: trapped}, timeout_seconds: 10, interval_seconds: 0.05}
"""


def test_process_ignoring_sigterm_is_killed_after_its_grace(tmp_path: Path) -> None:
    run = Run(tmp_path, STUBBORN)
    try:
        run.wait_state(lambda s: instance(s, "service_deaf")["ready"], what="deaf ready")
        run.signal(signal.SIGTERM)
        assert finish(run) == 128 + signal.SIGTERM
        reasons = [(e["reason"], e["object"]) for e in events(run.run_dir)]
        assert ("Killed", "instance/service_deaf") in reasons
    finally:
        run.close()


def test_status_and_logs_read_the_run_dir(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = Run(tmp_path, (ROOT / "examples" / "pools.yaml").read_text())
    assert finish(run) == 0
    status = subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run.run_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "pool train" in status.stdout and "service_watcher_node3" in status.stdout
    logs = subprocess.run(
        [sys.executable, "-m", "srtr", "logs", str(run.run_dir), "benchmark"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert logs.stdout == "train pool: node2,node3\n"
    down = subprocess.run(
        [sys.executable, "-m", "srtr", "down", str(run.run_dir)], capture_output=True, text=True
    )
    assert down.returncode == 2 and "not running" in down.stderr


def test_down_tears_a_manual_job_down(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = Run(tmp_path, RIDER)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        down = subprocess.run(
            [sys.executable, "-m", "srtr", "down", str(run.run_dir)],
            check=True,
            capture_output=True,
            text=True,
        )
        assert down.stdout.startswith("riders: tearing down tier by tier;"), down
        assert finish(run) == 128 + signal.SIGTERM
    finally:
        run.close()
    state = run.state()
    assert state is not None and state["job"]["reason"] == "torn down by user"
    assert all(i["phase"] == "Stopped" for i in state["instances"])


# ray-pool.yaml runs as written, to exit 0 and more, in test_ray_e2e (its driver uses every
# node) and in test_node_view_e2e (Ray from a venv under /tmp): a third run of Ray's ~30 s
# start here would only repeat them.
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml") if p.name != "ray-pool.yaml")


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_every_example_runs_to_its_end(tmp_path: Path, example: str) -> None:
    run = Run(tmp_path, (ROOT / "examples" / example).read_text())
    code = finish(run, timeout=90)
    assert code == 0, run.out + run.err
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Succeeded"


def test_control_socket_restarts_an_instance_and_refuses_when_the_job_is_gone(
    tmp_path: Path,
) -> None:
    import stat

    from srtr.runtime.control import ControlError, send

    run = Run(tmp_path, RIDER)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        sock = Path(state["job"]["control"])
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        old_pid = instance(state, "service_owner_node1")["pid"]
        assert send(run.run_dir, "restart", "service_owner_node1") == (
            "restarting service_owner_node1"
        )
        state = run.wait_state(
            lambda s: (
                instance(s, "service_owner_node1")["attempt"] == 1
                and instance(s, "service_owner_node1")["phase"] == "Running"
            ),
            what="owner restarted by intent",
        )
        assert instance(state, "service_owner_node1")["pid"] != old_pid
        assert instance(state, "service_owner_node1")["restarts"] == 0  # planned: no crash
        with pytest.raises(ControlError, match="no instance or service named 'ghost'"):
            send(run.run_dir, "restart", "ghost")
        assert send(run.run_dir, "teardown") == "tearing down tier by tier"
        assert finish(run) == 143
        assert not sock.exists()
        with pytest.raises(ControlError, match="not running"):
            send(run.run_dir, "restart", "service_owner_node1")
    finally:
        run.close()
