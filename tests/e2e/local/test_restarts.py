"""A running job's semantics in daily use (issue 23), end to end on the local backend.

Restarting what ended for good, planned restarts that are no crashes, and the
`srtr restart` / `srtr stop` verbs, on real `srtr up` processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srtr.runtime.control import send
from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e

# rider on node1 exits 3 until FLAG exists; max_restarts 1, so one crash-restart and then
# GaveUp. The one on node2 always runs.
FLAKY = """
name: daily
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
  - name: rider
    command: ["sh", "-c", "test -e {flag} || test {{node}} != node1 || exit 3; exec sleep 1000"]
    placement: {{pool: owner}}
    env: {{LEVEL: "{level}"}}
    restart: {{max_restarts: {budget}, backoff_seconds: 0.1}}
"""


def srtr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *args], capture_output=True, text=True, timeout=30
    )


def stop_run(run: Run) -> None:
    run.signal(signal.SIGINT)
    run.finish(gone_within=10)


def save(run: Run, text: str) -> None:
    tmp = run.recipe.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    tmp.replace(run.recipe)


def test_restart_of_a_given_up_instance_starts_it_with_a_fresh_budget(tmp_path: Path) -> None:
    # The flag appears while the job runs: in the run dir, which the nodes share with the
    # host (a /tmp file made after a node's view may stay hidden there).
    run_dir = tmp_path / "run"
    flag = run_dir / "flag"
    run = Run(tmp_path, FLAKY.format(flag=flag, level=1, budget=1), run_dir=run_dir)
    name = "service_rider_node1"
    try:
        state = run.wait_state(
            lambda s: s["job"]["phase"] == "Running" and instance(s, name)["phase"] == "Failed",
            what="rider on node1 to give up",
        )
        assert instance(state, name)["restarts"] == 1
        assert any(e["reason"] == "GaveUp" for e in events(run.run_dir))

        flag.write_text("")
        # The TUI's `r`: the control op, answered ok only if the instance starts again.
        answer = send(run.run_dir, "restart", name)
        state = run.wait_state(
            lambda s: instance(s, name)["phase"] == "Running" and instance(s, name)["pid"],
            what="the given-up rider to run again",
        )
        assert answer == f"restarting {name} (it was Failed)"
        # A user's restart is no crash: RESTARTS stays what the crashes made it.
        assert instance(state, name)["restarts"] == 1
        restarting = [
            e["message"]
            for e in events(run.run_dir)
            if e["reason"] == "Restarting" and e["object"] == f"instance/{name}"
        ]
        assert restarting[-1].startswith("restart requested by user: attempt 2 on node1")

        # The budget is fresh: one more crash is restarted, not given up on.
        os.kill(instance(state, name)["pid"], signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, name)["restarts"] == 2 and instance(s, name)["phase"] == "Running"
            ),
            what="the rider restarted after a crash, within its fresh budget",
        )

        typo = srtr("restart", str(run.run_dir), "ridr")
        assert typo.returncode == 2, typo
        assert "no instance or service named 'ridr'; did you mean 'rider'?" in typo.stderr
        done = srtr("restart", str(run.run_dir), "rider")  # the service: both its instances
        assert done.returncode == 0, done
        assert done.stdout.strip() == (
            f"daily: service rider: restarting {name}, restarting service_rider_node2"
        )
        run.wait_state(
            lambda s: (
                all(
                    instance(s, f"service_rider_node{k}")["attempt"] == a
                    for k, a in ((1, 4), (2, 1))
                )
                and all(i["phase"] == "Running" for i in s["instances"])
            ),
            what="both riders restarted",
        )
    finally:
        stop_run(run)
    gone = srtr("restart", str(run.run_dir), name)
    assert gone.returncode == 2, gone
    assert "is not running" in gone.stderr


def test_stop_then_restart_an_instance_from_the_cli(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    flag.write_text("")
    run = Run(tmp_path, FLAKY.format(flag=flag, level=1, budget=3))
    name = "service_rider_node2"
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        stopped = srtr("stop", str(run.run_dir), name)
        assert stopped.returncode == 0, stopped
        assert stopped.stdout.strip() == f"daily: stopping {name}"
        run.wait_state(lambda s: instance(s, name)["phase"] == "Stopped", what="stopped")
        again = srtr("stop", str(run.run_dir), name)
        assert again.returncode == 1, again
        assert f"{name} is already Stopped" in again.stderr
        back = srtr("restart", str(run.run_dir), name)
        assert back.returncode == 0, back
        assert f"restarting {name} (it was Stopped)" in back.stdout
        state = run.wait_state(
            lambda s: instance(s, name)["phase"] == "Running" and instance(s, name)["attempt"] == 1,
            what="the stopped rider to run again",
        )
        assert instance(state, name)["restarts"] == 0
        assert state["job"]["phase"] == "Running"
    finally:
        stop_run(run)


def test_rollouts_spend_no_restart_budget(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    flag.write_text("")
    run = Run(tmp_path, FLAKY.format(flag=flag, level=1, budget=2))
    name = "service_rider_node1"
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        for generation, level in ((2, 2), (3, 3)):
            save(run, FLAKY.format(flag=flag, level=level, budget=2))
            state = run.wait_state(
                lambda s, g=generation: (
                    s["job"]["observed_generation"] == g
                    and instance(s, name)["attempt"] == g - 1
                    and instance(s, name)["phase"] == "Running"
                ),
                what=f"generation {generation} rolled out",
            )
        assert instance(state, name)["restarts"] == 0
        history = instance(state, name)["history"]
        assert [h.get("planned") for h in history] == [
            "generation 2 (env changed)",
            "generation 3 (env changed)",
        ]
        mine = [e for e in events(run.run_dir) if e["object"] == f"instance/{name}"]
        restarting = [e["message"] for e in mine if e["reason"] == "Restarting"]
        assert restarting == [
            "generation 2 (env changed): attempt 1 on node1",
            "generation 3 (env changed): attempt 2 on node1",
        ]
        exits = [e for e in mine if e["reason"] == "Exited"]
        assert all("planned restart: generation" in e["message"] for e in exits), exits
        assert all(e["type"] == "Normal" for e in exits)

        # The first real crash is restarted: two rollouts spent nothing of max_restarts 2.
        os.kill(instance(state, name)["pid"], signal.SIGKILL)
        state = run.wait_state(
            lambda s: (
                instance(s, name)["restarts"] == 1 and instance(s, name)["phase"] == "Running"
            ),
            what="the rider restarted after its first crash",
        )
        assert not any(e["reason"] == "GaveUp" for e in events(run.run_dir))
    finally:
        stop_run(run)


# Owners serve on their node after a second; each rider connects to its own node's owner
# once, at start, and exits 1 (restart: never) if nobody answers.
GROW = """
name: grow
services:
  - name: api
    command: ["bash", "-c", "sleep 1; exec python3 -m http.server {port} --bind {{node_ip}}"]
    nodes: {nodes}
    readiness: {{tcp: {{port: {port}}}, interval_seconds: 0.05}}
  - name: client
    command:
      - bash
      - -c
      - exec 3<>/dev/tcp/{{node_ip}}/{port} && echo connected; exec sleep 1000
    placement: {{pool: api}}
    restart: never
"""


def test_live_pool_growth_starts_new_riders_after_their_owners_are_ready(
    tmp_path: Path,
) -> None:
    import random

    port = random.randint(20000, 40000)
    run = Run(tmp_path, GROW.format(port=port, nodes=2), "--nodes", "3")
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        save(run, GROW.format(port=port, nodes=3))
        state = run.wait_state(
            lambda s: s["job"]["observed_generation"] == 2, what="generation 2 converged"
        )
        owner, rider = "instance/service_api_node3", "instance/service_client_node3"
        log_of_events = events(run.run_dir)
        seen = [(e["reason"], e["object"]) for e in log_of_events]
        ready = seen.index(("Ready", owner))
        assert seen.index(("Launched", rider)) > ready, seen
        converged = [
            i
            for i, e in enumerate(log_of_events)
            if e["reason"] == "Converged" and "generation 2" in e["message"]
        ]
        assert converged and converged[0] > seen.index(("Launched", rider)), seen
        run.wait_state(
            lambda s: instance(s, "service_client_node3")["phase"] == "Running",
            what="the new rider running",
        )
        log = run.run_dir / instance(state, "service_client_node3")["log"]
        wait_for(lambda: "connected" in log.read_text(), 10, "the new rider to connect")
    finally:
        stop_run(run)


# A torchrun-style terminal pool: rank 0 is done at once; rank 1 fails a moment later.
RANKS = """
name: ranks
services:
  - name: train
    command: ["bash", "-c", "test {node} = node1 && exit 0; sleep 2; exit 3"]
    nodes: 2
    terminal: true
"""


def test_a_terminal_jobs_failure_names_the_failed_instance_and_rank0_is_no_warning(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, RANKS)
    assert run.finish() == 3, run.err
    seen = events(run.run_dir)
    failed = next(e for e in seen if e["reason"] == "JobFailed")
    assert failed["message"] == (
        "exit code 3: terminal service(s) failed (first failed: service_train_node2 on node2, "
        "exit code 3; see logs/service_train_node2.out)"
    )
    assert failed["message"] in run.out
    rank1_exit = next(
        i
        for i, e in enumerate(seen)
        if e["reason"] == "Exited" and e["object"] == "instance/service_train_node2"
    )
    early = [e for e in seen[:rank1_exit] if e["reason"] == "PoolNotReady"]
    assert not early, early  # rank 0 exiting 0 is its work done, not a warning
