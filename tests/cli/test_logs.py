"""`srtr logs` (issue 23): --tail, --since, --previous, a service's instances merged with
node prefixes, and -f; the slicing unit-tested, the verb on real runs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from srtr.cli.logs import attempts, parse_since, select
from srtr.store.rundir import restart_marker
from tests.support.e2e_util import Run, events, wait_for


def marker(attempt: int, at: str) -> bytes:
    when = datetime.fromisoformat(at).replace(tzinfo=UTC)
    return restart_marker(instance="x", attempt=attempt, node="node1", at=when).encode()


LOG = (
    b"first run\n"
    b"crashed mid-line"  # no newline: the marker ends this line
    + marker(1, "2026-12-02T07:00:00")
    + b"second run\n2026-12-02T07:10:00Z a stamped line\nafter it\n"
    + marker(2, "2026-12-02T07:20:00")
    + b"third run\n"
)
T = datetime(2026, 12, 2, 7, tzinfo=UTC).timestamp()


def test_attempts_split_at_the_markers_even_one_that_ends_a_line() -> None:
    found = attempts(LOG)
    assert [a.number for a in found] == [0, 1, 2]
    assert LOG[found[0].start : found[0].end] == b"first run\ncrashed mid-line"
    assert LOG[found[1].start : found[1].end].startswith(b"==== srtr: x attempt 1 starting")
    assert [a.started_at for a in found] == [None, T, T + 1200]
    assert attempts(b"no restarts\n")[0].end == len(b"no restarts\n")


def test_previous_is_the_attempt_before_the_last_restart() -> None:
    previous = select(LOG, previous=True)
    assert previous is not None
    assert previous.startswith(b"==== srtr: x attempt 1 starting")
    assert previous.endswith(b"after it\n") and b"third run" not in previous
    assert select(b"only one attempt\n", previous=True) is None


def test_tail_and_since_pick_lines_by_count_and_by_their_known_time() -> None:
    assert select(LOG, tail=2) == b"==== srtr: x attempt 2 starting on node1 at " + (
        b"2026-12-02T07:20:00.000000Z ====\nthird run\n"
    )
    assert select(LOG, tail=0) == b""
    # A stamped line dates the lines after it; the attempt's marker dates the lines before.
    since = select(LOG, since=T + 300, first_start=T - 600)
    assert since is not None
    assert since.startswith(b"2026-12-02T07:10:00Z a stamped line\nafter it\n")
    assert b"second run" not in since and since.endswith(b"third run\n")
    # The first attempt is dated by the job's start.
    assert b"first run" in (select(LOG, since=T - 601, first_start=T - 600) or b"")
    assert b"first run" not in (select(LOG, since=T - 599, first_start=T - 600) or b"")


def test_since_reads_durations_and_times() -> None:
    now = 10_000.0
    assert parse_since("5m", now) == now - 300
    assert parse_since("1h30m", now) == now - 5400
    assert parse_since("1.5s", now) == now - 1.5
    assert parse_since("2026-12-02T07:00:00Z", now) == T
    with pytest.raises(ValueError, match="neither a duration"):
        parse_since("yesterday", now)


# -- on real runs ---------------------------------------------------------------------------

RECIPE = """
name: logs
services:
  - name: flaky
    command: ["bash", "-c", "echo hello from {node}; echo bye from {node}; exit 3"]
    nodes: 2
    restart: {policy: on-failure, backoff_seconds: 0.1, max_backoff_seconds: 0.1, max_restarts: 2}
  - name: ticker
    command: ["bash", "-c", "for i in $(seq 100000); do echo tick $i {node}; sleep 0.1; done"]
    placement: {pool: flaky}
"""


def logs(run: Run, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", "logs", str(run.run_dir), *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _gave_up(run: Run) -> bool:
    return sum(e["reason"] == "GaveUp" for e in events(run.run_dir)) == 2


@pytest.mark.e2e
def test_logs_of_a_service_an_attempt_a_tail_and_a_follow(tmp_path: Path) -> None:
    run = Run(tmp_path, RECIPE)
    follower = None
    try:
        wait_for(lambda: _gave_up(run), 60, "both flaky instances to give up")
        # The service: both instances, every line prefixed with its node.
        done = logs(run, "flaky")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines and all(re.match(r"\[node[12]\] ", line) for line in lines)
        assert lines.count("[node1] hello from node1") == 3  # three attempts
        assert lines.count("[node2] bye from node2") == 3
        # One instance's previous attempt: the second of three.
        done = logs(run, "service_flaky_node2", "--previous")
        assert done.returncode == 0, done.stderr
        assert "attempt 1 starting on node2" in done.stdout
        assert "attempt 2" not in done.stdout
        assert done.stdout.count("hello from node2") == 1
        # The last line of each instance.
        done = logs(run, "flaky", "--tail", "1")
        assert sorted(done.stdout.splitlines()) == [
            "[node1] bye from node1",
            "[node2] bye from node2",
        ]
        # Since an hour ago: every attempt of both (the job started after that).
        done = logs(run, "flaky", "--since", "1h")
        assert done.stdout.count("hello from") == 6
        # No previous attempt: exit 2 with the reason.
        done = logs(run, "service_ticker_node1", "--previous")
        assert done.returncode == 2
        assert "no previous attempt of service_ticker_node1" in done.stderr
        # Follow the ticker on both nodes until the job ends.
        follower = subprocess.Popen(
            [sys.executable, "-m", "srtr", "logs", str(run.run_dir), "ticker", "-f"],
            stdout=subprocess.PIPE,
            text=True,
        )
        seen: list[str] = []
        assert follower.stdout is not None
        reader = threading.Thread(target=lambda: seen.extend(follower.stdout))  # type: ignore[union-attr]
        reader.start()
        before = len(logs(run, "ticker").stdout.splitlines())
        wait_for(lambda: len(seen) > before + 4, 30, "new ticks followed")
        assert all(re.fullmatch(r"\[node[12]\] tick \d+ node[12]\n", line) for line in seen)
        assert {line[:7] for line in seen} == {"[node1]", "[node2]"}
        run.signal(signal.SIGTERM)
        assert follower.wait(30) == 0  # the job ended: so does the follow
        reader.join(10)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        run.finish()
