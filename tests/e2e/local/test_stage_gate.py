"""The stage gate on real processes (local backend): it fails the job as srtctl's does.

A service instance that exits before its readiness probe passed, with no restart to bring it
back, or that is not ready `timeout_seconds` after its stage began, fails the job with exit
code 1 whether or not the service is critical, and what was started is torn down. After the
gate, a non-critical exit is only recorded (reference S-61, S-70).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e_util import Run, events, instance

pytestmark = pytest.mark.e2e

finish = functools.partial(Run.finish, gone_within=10.0)

# `x` owns three nodes (restart: never, an owner's default; not critical); `base` came up
# in an earlier stage, `app` comes after x's stage. Instance {index} 2 runs on node3.
GATED = """
name: gate
services:
  - name: base
    command: ["sleep", "1000"]
    start: infra
  - name: x
    command: ["bash", "-c", "{x}"]
    nodes: 3
    start: before_workers
    readiness: {{log: {{pattern: "^up$"}}, timeout_seconds: {timeout}, interval_seconds: 0.05}}
  - name: app
    command: ["sleep", "1000"]
"""


def gated(node3: str, timeout: float = 30) -> str:
    """GATED where instances 0 and 1 get ready and stay up, and node3 runs `node3`."""
    x = f"if [ {{index}} = 2 ]; then {node3}; fi; echo up; exec sleep 1000"
    return GATED.format(x=x, timeout=timeout)


def assert_torn_down_before_app(run: Run, state: dict[str, Any]) -> None:
    assert state["job"]["phase"] == "Failed" and state["job"]["exit_code"] == 1
    for name in ("service_base", "service_x_node1", "service_x_node2"):
        assert instance(state, name)["phase"] == "Stopped", name
    app = instance(state, "service_app")
    assert app["phase"] == "Pending" and app["pid"] is None  # its stage never began
    assert not (run.run_dir / "logs" / "service_app.out").exists()
    reasons = [e["reason"] for e in events(run.run_dir)]
    assert "TearingDown" in reasons and reasons[-1] == "JobFailed"


def test_an_instance_that_exits_before_ready_fails_the_job(tmp_path: Path) -> None:
    # bash's "command not found": exit code 127, before the probe could pass
    run = Run(tmp_path, gated("exec srtr-no-such-command"))
    assert finish(run) == 1, run.out + run.err
    state = run.state()
    assert state is not None
    reason = (
        "services[x] exited with code 127 on node3 before its readiness probe passed "
        "(log matches /^up$/, timeout=30s); see logs/service_x_node3.out"
    )
    assert state["job"]["reason"] == reason
    assert f"exit code 1: {reason}" in run.out  # the JobFailed progress line
    node3 = instance(state, "service_x_node3")
    assert (node3["phase"], node3["exit_code"], node3["ready"]) == ("Failed", 127, False)
    assert not instance(state, "service_x_node3")["critical"]
    assert_torn_down_before_app(run, state)


def test_an_instance_not_ready_within_its_timeout_fails_the_job(tmp_path: Path) -> None:
    run = Run(tmp_path, gated("exec sleep 1000", timeout=2.5))
    assert finish(run) == 1, run.out + run.err
    state = run.state()
    assert state is not None
    reason = (
        "services[x] on node3 was not ready within 2.5s (log matches /^up$/, timeout=2.5s); "
        "see logs/service_x_node3.out"
    )
    assert state["job"]["reason"] == reason
    assert instance(state, "service_x_node3")["phase"] == "Stopped"
    failed = [e for e in events(run.run_dir) if e["reason"] == "ProbeFailed"]
    assert [(e["object"], e["type"]) for e in failed] == [("instance/service_x_node3", "Warning")]
    assert failed[0]["message"].startswith(reason)
    assert_torn_down_before_app(run, state)


# After the gate: node3 gets ready, waits until `app` (the next stage) launched, then exits 3.
# The benchmark (the last stage) waits until srtr recorded that exit and ends the job with 0:
# the job went on.
AFTER = """
name: after
services:
  - name: x
    command:
      - bash
      - -c
      - >-
        echo up; if [ {index} = 2 ]; then
        until grep -q 'instance/service_app' "$SRTR_RUN_DIR/events.jsonl"; do sleep 0.05; done;
        exit 3; fi; exec sleep 1000
    nodes: 3
    readiness: {log: {pattern: "^up$"}, interval_seconds: 0.05}
  - name: app
    command: ["sleep", "1000"]
benchmark:
  type: custom
  command: >-
    for i in $(seq 300); do
    grep -q 'exited with code 3 on node3' "$SRTR_RUN_DIR/events.jsonl" && exit 0; sleep 0.1;
    done; exit 9
"""


def test_after_the_gate_a_non_critical_exit_does_not_fail_the_job(tmp_path: Path) -> None:
    run = Run(tmp_path, AFTER)
    assert finish(run) == 0, run.out + run.err
    state = run.state()
    assert state is not None
    assert state["job"]["phase"] == "Succeeded"
    assert state["job"]["reason"] == "benchmark exited with code 0"
    node3 = instance(state, "service_x_node3")
    assert (node3["phase"], node3["exit_code"], node3["ready"]) == ("Failed", 3, True)
    assert instance(state, "service_app")["phase"] == "Stopped"  # it ran until the end
    exited = [
        e
        for e in events(run.run_dir)
        if e["reason"] == "Exited" and e["object"] == "instance/service_x_node3"
    ]
    assert [(e["type"], e["message"]) for e in exited] == [
        ("Warning", "exited with code 3 on node3")
    ]


# Issue 21: a service none of whose launches ever ran, no probe, not critical. srtctl counts
# such a member up once its srun exists; srtr fails the job and names the command and log.
NEVER_RAN = """
name: gate
services:
  - name: x
    command: {command}
    nodes: 3
  - name: app
    command: ["sleep", "1000"]
benchmark:
  type: custom
  command: "sleep 1000"
"""


@pytest.mark.parametrize(
    ("launcher", "command", "why"),
    [
        ("process", '["srtr-no-such-tool", "--serve"]', "could not be started on node"),
        ("agent", '["srtr-no-such-tool", "--serve"]', "could not be started on node"),
        ("process", '["bash", "-c", "srtr-no-such-tool --serve"]', "exited with code 127 on"),
    ],
)
def test_a_stage_whose_every_launch_fails_fails_the_job(
    tmp_path: Path, launcher: str, command: str, why: str
) -> None:
    run = Run(tmp_path, NEVER_RAN.format(command=command), "--launcher", launcher)
    assert finish(run) == 1, run.out + run.err
    state = run.state()
    assert state is not None
    reason = state["job"]["reason"]
    assert reason.startswith(f"services[x] {why}"), reason
    assert "srtr-no-such-tool --serve" in reason and "; see logs/service_x_node" in reason
    assert f"exit code 1: {reason}" in run.out
    if "could not be started" in why:
        # A launch that never started holds its stage: the job never says it is up.
        messages = [e["message"] for e in events(run.run_dir)]
        assert not any("every stage is up" in m for m in messages), messages
        assert "Converged" not in [e["reason"] for e in events(run.run_dir)]
        assert instance(state, "service_app")["pid"] is None  # its stage never began
    # An exit 127 of a member without a probe may come after its stage passed (it was
    # "ready" once launched); the job fails all the same (`decisions.unstartable`).
