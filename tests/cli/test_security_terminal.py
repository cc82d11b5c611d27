"""Hostile program output read with `srtr logs` and `srtr status`: on a terminal it is shown,
never obeyed; `--tail` of a huge log costs a block, not the log; `\\r` ends no line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srtr.cli import logs, terminal_text
from tests.support.pty_util import PtyProgram

# A window title, the clipboard (OSC 52), the alternate screen, a bell, a line rewrite.
HOSTILE = (
    b"start\x1b]0;owned title\x07 \x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[?1049h"
    b"\x9b31m progress 10%\rprogress 100%\n"
)
ESCAPES = (b"\x1b", b"\x07", b"\x9b", "\x9b".encode())


def _run_dir(tmp_path: Path, log: bytes, reason: str = "") -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    doc = {
        "version": 1,
        "job": {
            "name": "t",
            "backend": "local",
            "phase": "Running",
            "started_at": time.time(),
            "reason": reason,
        },
        "instances": [
            {
                "name": "service_a",
                "service": "a",
                "node": "node1",
                "log": "logs/service_a.out",
                "phase": "Failed",
                "reason": reason,
                "pid": None,
                "restarts": 0,
                "attempt": 1,
                "exit_code": 1,
                "ready": False,
            }
        ],
    }
    (run_dir / "state.json").write_text(json.dumps(doc))
    (run_dir / "logs" / "service_a.out").write_bytes(log)
    return run_dir


def _on_terminal(tmp_path: Path, *argv: str) -> bytes:
    program = PtyProgram(
        [sys.executable, "-m", "srtr", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    deadline = time.monotonic() + 60
    while program.proc.poll() is None and time.monotonic() < deadline:
        program.pump()
    for _ in range(20):
        program.pump(0.01)
    assert program.proc.wait(timeout=10) == 0, bytes(program.raw)
    return bytes(program.raw)


def test_logs_on_a_terminal_print_no_escape(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, HOSTILE)
    shown = _on_terminal(tmp_path, "logs", str(run_dir), "a")
    for escape in ESCAPES:
        assert escape not in shown
    assert b"^[]0;owned title^G" in shown and b"^M" in shown
    tail = _on_terminal(tmp_path, "logs", str(run_dir), "a", "--tail", "1")
    assert b"^[" in tail and b"\x1b" not in tail


def test_logs_raw_and_pipes_keep_the_bytes(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, HOSTILE)
    piped = subprocess.run(
        [sys.executable, "-m", "srtr", "logs", str(run_dir), "a"], capture_output=True, check=True
    )
    assert piped.stdout == HOSTILE
    raw = _on_terminal(tmp_path, "logs", str(run_dir), "a", "--raw")
    assert b"\x1b]0;owned title\x07" in raw


def test_status_on_a_terminal_prints_no_escape(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, b"", reason="exited 1: \x1b]0;owned\x07\x1b[2J")
    shown = _on_terminal(tmp_path, "status", str(run_dir))
    assert b"owned" in shown
    assert b"\x1b]0;owned" not in shown and b"\x1b[2J" not in shown and b"\x07" not in shown


def test_a_carriage_return_ends_no_line() -> None:
    data = b"one\rtwo\nthree\r\n"
    assert logs.select(data, tail=1) == b"three\r\n"
    assert logs.select(data, tail=2) == data
    assert terminal_text.lines("a\rb\x0cc\nd") == ["a\rb\x0cc\n", "d"]


def test_tail_of_a_150_mb_log_stays_under_60_mb(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, b"")
    line = b"x" * 99 + b"\n"
    with (run_dir / "logs" / "service_a.out").open("wb") as handle:
        block = line * 10_000
        for _ in range(150):
            handle.write(block)
        handle.write(b"the last line\n")
    # Measured from a small parent: a child's peak counts what it was forked from (pytest).
    measure = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], "
        "capture_output=True); sys.stdout.buffer.write(done.stdout); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    argv = [sys.executable, "-m", "srtr", "logs", str(run_dir), "a", "--tail", "1"]
    done = subprocess.run(
        [sys.executable, "-c", measure, *argv], capture_output=True, check=True, timeout=120
    )
    *printed, peak_line = done.stdout.decode().splitlines()
    peak = int(peak_line)  # KiB
    assert printed == ["the last line"]
    assert peak < 60 * 1024, f"srtr logs --tail 1 peaked at {peak // 1024} MiB"


@pytest.mark.parametrize("count", [0, 1, 5, 700])
def test_tail_bytes_from_the_end_equals_tail_of_the_whole(tmp_path: Path, count: int) -> None:
    path = tmp_path / "log"
    data = b"".join(b"line %d %s\n" % (i, b"y" * (i % 300)) for i in range(2000))
    path.write_bytes(data)
    with path.open("rb") as handle:
        end = logs.tail_bytes(handle, len(data), count)
    assert logs.select(end, tail=count) == logs.select(data, tail=count)
    assert len(end) < len(data) or count == 700


def test_follow_holds_a_bounded_partial_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-f` of an instance that writes no newline: it prints it in pieces of at most
    MAX_PARTIAL (with prefixes), never holding the whole of it."""
    run_dir = _run_dir(tmp_path, b"")
    log = run_dir / "logs" / "service_a.out"
    log.write_bytes(b"z" * (3 * logs.MAX_PARTIAL))
    written: list[bytes] = []

    class Out:
        def write(self, data: bytes) -> None:
            written.append(data)

        def flush(self) -> None:
            return None

    monkeypatch.setattr(logs, "_runs", lambda run_dir: False)
    chosen = [{"name": "service_a", "log": "logs/service_a.out", "node": "node1"}]
    logs._follow(run_dir, chosen, {"service_a": "[node1] "}, {"service_a": 0}, Out())  # type: ignore[arg-type]
    assert b"".join(written).count(b"z") == 3 * logs.MAX_PARTIAL
