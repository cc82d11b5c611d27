"""What the TUI says of ended instances and of a job whose stages are up (pure view-model)."""

from __future__ import annotations

from typing import Any

from srtr.tui import viewmodel as vm
from srtr.tui.viewmodel.header import header

NOW = 1_700_000_000.0


def failed(**kw: Any) -> dict[str, Any]:
    inst: dict[str, Any] = {
        "name": "service_train_node2",
        "service": "train",
        "kind": "owner",
        "node": "node2",
        "node_ip": "127.0.0.3",
        "phase": "Failed",
        "ready": True,  # its attempt passed readiness before it failed
        "restarts": 0,
        "exit_code": 1,
        "attempt": 0,
        "started_at": NOW - 600,
        "command": ["x"],
        "env": {},
        "history": [{"attempt": 0, "exit_code": 1, "signal": None, "at": NOW - 540}],
    }
    inst.update(kw)
    return inst


def test_a_failed_instance_is_not_ready_in_its_row_and_its_details() -> None:
    inst = failed()
    row = vm.instance_row(inst, NOW)
    assert row.cells[vm.COLUMN_KEYS.index("ready")] == "no"
    status = dict(vm.detail(inst, NOW).facts)["status"]
    assert status.startswith("Failed · ready no"), status


def test_an_ended_instances_age_stops_when_it_ended() -> None:
    inst = failed()
    for later in (NOW, NOW + 3600):
        row = vm.instance_row(inst, later)
        assert row.cells[vm.COLUMN_KEYS.index("age")] == "60s"  # it ran 60 s
        assert "ran 60s" in dict(vm.detail(inst, later).facts)["status"]
    running = failed(phase="Running", history=[])
    assert vm.instance_row(running, NOW).cells[vm.COLUMN_KEYS.index("age")] == "10m"
    # A restarted instance's age counts its new attempt, which has not ended.
    again = failed(phase="Running", attempt=1, started_at=NOW - 30)
    assert vm.instance_row(again, NOW + 30).cells[vm.COLUMN_KEYS.index("age")] == "60s"


def job(**kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "j",
        "phase": "Running",
        "stages": ["infra", "workers", "benchmark"],
        "stage": 2,
        "passed_stages": ["infra", "workers"],
    }
    doc.update(kw)
    return {"job": doc, "instances": []}


def test_the_stage_line_says_when_every_stage_is_up() -> None:
    assert header(job(), NOW).stage == "stage 3/3 benchmark"
    up = job(passed_stages=["infra", "workers", "benchmark"])
    assert header(up, NOW).stage == "all 3 stages up"
    one = job(stages=["only"], stage=0, passed_stages=["only"])
    assert header(one, NOW).stage == "the stage is up"


def test_the_stage_line_says_what_a_dependent_waits_for() -> None:
    waiting = job(passed_stages=["infra"], stage=1, waiting={"workers": "scheduler ready"})
    assert header(waiting, NOW).stage == "stage 2/3 workers · waiting: workers for scheduler ready"
    assert header(job(waiting={}), NOW).stage == "stage 3/3 benchmark"


def test_the_header_names_the_instance_of_the_first_failure() -> None:
    cause = {"instance": "service_train_node3", "summary": "x"}
    assert header(job(phase="Failed", cause=cause), NOW).cause_instance == "service_train_node3"
    assert header(job(), NOW).cause_instance == ""


def test_the_detail_history_names_each_failures_class() -> None:
    inst = failed(
        history=[
            {"attempt": 0, "exit_code": 137, "signal": 9, "at": NOW - 90, "reason": "OOMKilled"},
            {"attempt": 1, "exit_code": 0, "signal": None, "at": NOW - 30},
        ],
        attempt=1,
    )
    lines = vm.detail(inst, NOW).history
    assert lines[0] == "#1 exit 0 · 30s ago"
    assert lines[1] == "#0 exit 137 (SIGKILL) · 90s ago · OOMKilled"
