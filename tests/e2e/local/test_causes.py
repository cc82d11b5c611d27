"""The first failure, OOM kills and `srtr wait` on real `srtr up` runs (local backend).

Run under the e2e lock: `flock /tmp/srtr-e2e.lock python3 -m pytest -q tests/test_cause_e2e.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e

LAUNCHERS = pytest.mark.parametrize("launcher", ["process", "agent"])

# A static rendezvous of 4 ranks: rank 2 (node3) fails first; the others notice (the file it
# leaves in the run dir) and abort a moment later with 134, as a collective's watchdog does.
RANKS = """
name: ranks
services:
  - name: train
    command:
      - bash
      - -c
      - |
        if [ "$SRTR_NODE" = node3 ]; then
          echo "rank 2: loading shard 7"
          echo "rank 2: CUDA error: an illegal memory access was encountered"
          touch "$SRTR_RUN_DIR/rank2-failed"
          exit 1
        fi
        until [ -e "$SRTR_RUN_DIR/rank2-failed" ]; do sleep 0.05; done
        sleep 1
        echo "rank on $SRTR_NODE: watchdog: collective timed out, aborting"
        exit 134
    nodes: 4
    terminal: true
"""


def srtr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *args], capture_output=True, text=True, timeout=60
    )


@LAUNCHERS
def test_the_first_failed_rank_is_the_cause_everywhere(tmp_path: Path, launcher: str) -> None:
    run = Run(tmp_path, RANKS, "--launcher", launcher)
    assert run.finish() == 1, run.err  # rank 2's code, not the others' 134
    state = run.state()
    assert state is not None
    job = state["job"]
    cause = job["cause"]
    assert cause is not None
    assert (cause["instance"], cause["node"]) == ("service_train_node3", "node3")
    assert (cause["exit_code"], cause["reason"], cause["attempt"]) == (1, "Error", 0)
    assert "service_train_node3 on node3" in job["reason"] and "134" not in job["reason"]
    for rank in ("node1", "node2", "node4"):
        assert instance(state, f"service_train_{rank}")["exit_code"] == 134
    # `srtr up`'s last lines: the end, the first failure with its log tail, the run dir.
    tail = run.out.splitlines()[-6:]
    assert any("JobFailed" in line and "service_train_node3" in line for line in tail), tail
    assert "first failure: service_train_node3 on node3 at " in run.out
    assert "  | rank 2: CUDA error: an illegal memory access was encountered" in run.out
    # `srtr status`: the cause block with that attempt's last lines.
    status = srtr("status", str(run.run_dir))
    assert status.returncode == 0, status.stderr
    assert "first failure: service_train_node3 on node3" in status.stdout
    assert "  | rank 2: loading shard 7" in status.stdout
    as_json = json.loads(srtr("status", str(run.run_dir), "-o", "json").stdout)
    assert as_json["job"]["cause"]["instance"] == "service_train_node3"
    # `srtr wait` on the ended run: at once, with the job's code and the same cause.
    waited = srtr("wait", str(run.run_dir))
    assert waited.returncode == 1, waited.stderr
    assert "first failure: service_train_node3" in waited.stdout
    # The ranks that aborted later are failures too (Warnings), but not the cause.
    seen = events(run.run_dir)
    exits = [e for e in seen if e["reason"] == "Exited"]
    assert all(e["type"] == "Warning" for e in exits), exits


TEARDOWN = """
name: td
services:
  - name: db
    command: ["bash", "-c", "sleep 0.5; echo db broke; exit 3"]
    critical: true
  - name: ray
    command: ["bash", "-c", "trap 'exit 1' TERM; while true; do sleep 0.05; done"]
    nodes: 2
"""


def test_exits_on_the_teardowns_sigterm_are_stopped_not_failures(tmp_path: Path) -> None:
    run = Run(tmp_path, TEARDOWN)
    assert run.finish() == 1, run.err
    state = run.state()
    assert state is not None
    assert state["job"]["cause"]["instance"] == "service_db"
    for name in ("service_ray_node1", "service_ray_node2"):
        member = instance(state, name)
        assert member["phase"] == "Stopped" and member["exit_code"] == 1, member
        assert not any("reason" in h for h in member["history"]), member["history"]
        warned = [
            e
            for e in events(run.run_dir)
            if e["object"] == f"instance/{name}" and e["type"] == "Warning"
        ]
        assert not warned, warned


OOM = """
name: oom
services:
  - name: hog
    command:
      - python3
      - -c
      - |
        print("allocating", flush=True)
        hoard = []
        while True:
            hoard.append(bytearray(8 * 1024 * 1024))
    limits: {memory: 64Mi}
    terminal: true
    restart: never
"""


@LAUNCHERS
def test_a_process_over_its_memory_limit_is_oom_killed(tmp_path: Path, launcher: str) -> None:
    run = Run(tmp_path, OOM, "--launcher", launcher)
    assert run.finish(timeout=120) == 137, run.err
    state = run.state()
    assert state is not None
    cause = state["job"]["cause"]
    assert cause["reason"] == "OOMKilled" and cause["signal_name"] == "SIGKILL", cause
    assert "OOMKilled" in state["job"]["reason"]
    hog = instance(state, "service_hog")
    assert hog["history"][-1]["reason"] == "OOMKilled"
    exited = [e for e in events(run.run_dir) if e["reason"] == "Exited"]
    assert exited and "(OOMKilled)" in exited[-1]["message"], exited
    status = srtr("status", str(run.run_dir))
    assert "(OOMKilled); see logs/service_hog.out" in status.stdout
    # Its cgroup is gone with it.
    leftover = list(Path("/sys/fs/cgroup/memory").rglob("service_hog.0"))
    assert not leftover, leftover


HOLD = """
name: hold
services:
  - name: worker
    command: ["bash", "-c", "until [ -e \\"$SRTR_RUN_DIR/go\\" ]; do sleep 0.05; done; exit 7"]
    terminal: true
"""


def test_srtr_wait_times_out_then_returns_the_jobs_code(tmp_path: Path) -> None:
    run = Run(tmp_path, HOLD)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="the job running")
        timed_out = srtr("wait", str(run.run_dir), "--timeout", "0.5")
        assert timed_out.returncode == 124, timed_out.stderr
        assert "did not end within 0.5s (phase Running)" in timed_out.stderr
        waiter = subprocess.Popen(
            [sys.executable, "-m", "srtr", "wait", str(run.run_dir), "--timeout", "120"],
            stdout=subprocess.PIPE,
            text=True,
        )
        (run.run_dir / "go").touch()
        out, _ = waiter.communicate(timeout=120)
        assert waiter.returncode == 7, out
        assert "hold: Failed, exit code 7" in out
        assert run.wait() == 7
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")


UNLIMITED = OOM.replace("    limits: {memory: 64Mi}\n", "")


def test_an_oom_kill_without_a_limit_is_seen_in_the_kernels_log(tmp_path: Path) -> None:
    """The whole run in a memory cgroup of 400Mi (as a job in a SLURM allocation is), the
    hog without a limit of its own: the kernel's OOM killer picks it, srtr names it."""
    group = Path("/sys/fs/cgroup/memory") / f"srtr-test-{uuid.uuid4().hex[:8]}"
    if not Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() or os.geteuid():
        pytest.skip("needs the cgroup v1 memory controller as root")
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(400 * 1024 * 1024))
        procs = str(group / "cgroup.procs")

        def enter() -> None:  # in the child, before srtr up starts
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

        run = Run(tmp_path, UNLIMITED, preexec=enter)
        assert run.finish(timeout=120) == 137, run.err
        state = run.state()
        assert state is not None
        cause = state["job"]["cause"]
        assert cause["instance"] == "service_hog" and cause["reason"] == "OOMKilled", cause
    finally:
        wait_for(lambda: not (group / "tasks").read_text().strip(), 30, "the cgroup empty")
        group.rmdir()
