"""`srtr wait` on run dirs written by hand: its exit codes, what it prints, when it returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from srtr.cli import main
from srtr.store.rundir import restart_marker
from tests.support.e2e_util import wait_for


def write_state(run_dir: Path, **job: Any) -> None:
    doc = {"job": {"name": "j", "phase": "Running", **job}, "instances": []}
    tmp = run_dir / "state.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, run_dir / "state.json")  # atomically, as srtr writes it


CAUSE = {
    "instance": "service_train_node3",
    "node": "node3",
    "attempt": 0,
    "at": 1.0,
    "reason": "Error",
    "exit_code": 1,
    "signal": None,
    "signal_name": None,
    "message": "exited with code 1",
    "log": "logs/service_train_node3.out",
    "log_offset": 6,
    "summary": "service_train_node3 on node3 at 00:00:01: exit code 1 (Error); see LOG",
}


def test_an_ended_job_returns_at_once_with_its_code_reason_and_log_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "logs").mkdir()
    lines = [f"line {i}" for i in range(15)]
    marker = restart_marker(
        instance="service_train_node3", attempt=1, node="node3", at=datetime.now(UTC)
    )
    (tmp_path / "logs" / "service_train_node3.out").write_text(
        "older\n" + "\n".join(lines) + "\n" + marker + "later attempt\n"
    )
    write_state(tmp_path, phase="Failed", exit_code=3, reason="it broke", cause=CAUSE)
    assert main(["wait", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "j: Failed, exit code 3: it broke" in out
    assert "first failure: service_train_node3 on node3" in out
    assert "  | line 14" in out and "  | line 5" in out
    assert "line 4" not in out  # the last 10 lines of the attempt
    assert "later attempt" not in out and "older" not in out  # that attempt's lines only


def test_a_succeeded_job_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_state(tmp_path, phase="Succeeded", exit_code=0, reason="benchmark exited with code 0")
    assert main(["wait", str(tmp_path)]) == 0
    assert "Succeeded, exit code 0" in capsys.readouterr().out


def test_a_job_that_does_not_end_in_time_is_124(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_state(tmp_path)
    assert main(["wait", str(tmp_path), "--timeout", "0.3"]) == 124
    assert "did not end within 0.3s (phase Running)" in capsys.readouterr().err


def test_a_bad_run_dir_is_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wait", str(tmp_path / "nope")]) == 2
    assert main(["wait", str(tmp_path)]) == 2  # no state.json, not a submitted job
    (tmp_path / "state.json").write_text("[1, 2]")
    assert main(["wait", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no such run dir" in err and "not an srtr state file" in err
    with pytest.raises(SystemExit) as usage:
        main(["wait", str(tmp_path), "--timeout", "-1"])
    assert usage.value.code == 2


def test_it_returns_when_the_job_ends(tmp_path: Path) -> None:
    write_state(tmp_path)
    waiter = subprocess.Popen(
        [sys.executable, "-m", "srtr", "wait", str(tmp_path), "--timeout", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    # Once it watches (its inotify fd is open: it read the running state), end the job.
    wait_for(lambda: watching(waiter.pid) or waiter.poll() is not None, 30, "the watch")
    assert waiter.poll() is None, "it returned while the job ran"
    write_state(tmp_path, phase="Running", reason="still")  # a change that ends nothing
    write_state(tmp_path, phase="Failed", exit_code=7, reason="done badly")
    out, _ = waiter.communicate(timeout=30)
    assert waiter.returncode == 7, out
    assert "exit code 7: done badly" in out


def watching(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any("inotify" in os.readlink(fd) for fd in fds.iterdir())
    except OSError:
        return False


def test_a_submitted_job_is_waited_for_until_it_starts(tmp_path: Path) -> None:
    (tmp_path / "submit.sh").write_text("#!/bin/sh\n")
    assert main(["wait", str(tmp_path), "--timeout", "0.2"]) == 124


def test_up_after_the_tui_prints_the_first_failure_with_its_log_tail(tmp_path: Path) -> None:
    from srtr.tui.job_end import summary_lines

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "service_train_node3.out").write_text("older\nrank 2: boom\n")
    (tmp_path / "events.jsonl").write_text(
        json.dumps(
            {
                "ts": 1.0,
                "type": "Warning",
                "reason": "JobFailed",
                "object": "job",
                "message": "exit code 1: it broke",
                "generation": 1,
            }
        )
        + "\n"
    )
    write_state(tmp_path, phase="Failed", exit_code=1, reason="it broke", cause=CAUSE)
    lines = summary_lines(tmp_path)
    assert "JobFailed" in lines[0] and lines[0].endswith("job: exit code 1: it broke")
    assert lines[1].startswith("first failure: service_train_node3 on node3")
    assert lines[-2] == "  | rank 2: boom" and "older" not in "\n".join(lines)
    assert lines[-1].startswith("run dir: ")
    write_state(tmp_path, phase="Succeeded", exit_code=0, reason="fine", cause=CAUSE)
    assert not any("first failure" in line for line in summary_lines(tmp_path))
