"""A live job under attack from another local user: a flood of idle connections, and a
second controller that would take the job over.

The attacker (`security_util.Attacker`) is a real unprivileged user without the job's
credentials: it finds the control port as anyone can (the listening sockets of the host),
never through the 0600 control.json.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, instance, wait_for
from tests.support.security_util import Attacker, attacker  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

# A critical service that crashes and is relaunched (its budget allows it), beside one that
# keeps running: a relaunch needs descriptors (a log, a pidfd) while the flood holds them.
FLAKY = """
name: flood
services:
  - name: steady
    command: ["sleep", "1000"]
  - name: flaky
    command: ["bash", "-c", "echo up; sleep 2; exit 3"]
    critical: true
    start: before_workers
    readiness: {log: {pattern: up}, timeout_seconds: 30, interval_seconds: 0.05}
    restart: {policy: on-failure, max_restarts: 50, backoff_seconds: 0.1}
"""

# 3,000 connections that complete TCP, begin a TLS record and then say nothing, held for
# `hold` seconds (a byte sent pushes each into the server's accept queue): dialled
# in batches, each given a second to complete, for up to 20 s; it reports how many completed
# (those the controller does not take wait in the kernel's backlog, or not at all).
FLOOD = """
import select, socket, sys, time
port, count, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held, deadline = [], time.monotonic() + 20
while len(held) < count and time.monotonic() < deadline:
    batch = []
    for _ in range(min(200, count - len(held))):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        batch.append(s)
    poll = select.poll()  # select() stops at descriptor 1,024
    for s in batch:
        poll.register(s, select.POLLOUT)
    done = {fd for fd, _ in poll.poll(1000)}
    for s in batch:
        if s.fileno() in done and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            try:
                s.send(bytes.fromhex("160301"))  # a TLS record begun: never finished
                held.append(s)
            except OSError:
                s.close()
        else:
            s.close()
print(len(held), flush=True)
time.sleep(hold)
"""


def _control_port(run: Run) -> int:
    doc = json.loads((run.run_dir / "control.json").read_text())
    return int(doc["addresses"][0].rpartition(":")[2])


def _status(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _nofile_1024() -> None:
    # The host of the finding: 1,024 descriptors, and here no way to raise them.
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_a_flood_of_idle_connections_stops_nothing(
    attacker: Attacker,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, FLAKY, preexec=_nofile_1024)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        port = _control_port(run)  # what `ss -ltn` shows anyone
        flood = attacker.start(FLOOD, str(port), "3000", "60")
        try:
            assert flood.stdout is not None
            opened = int(flood.stdout.readline())
            assert opened >= 64  # it did open connections (most wait, or never complete)
            # Through the flood: relaunches go on, state.json is written, the heartbeat beats.
            before = instance(run.wait_state(lambda s: True), "service_flaky")["restarts"]
            beat = json.loads((run.run_dir / "heartbeat.json").read_text())["ts"]
            state = run.wait_state(
                lambda s: instance(s, "service_flaky")["restarts"] >= before + 2,
                timeout=60,
                what="two relaunches of the critical service during the flood",
            )
            assert state["job"]["phase"] == "Running"
            wait_for(
                lambda: json.loads((run.run_dir / "heartbeat.json").read_text())["ts"] > beat + 2,
                30,
                "the heartbeat to go on",
            )
            status = _status(run.run_dir)
            assert status.returncode == 0 and "controller=running" in status.stdout
            assert "crashed" not in status.stdout
        finally:
            flood.kill()
            flood.wait()
        run.signal(signal.SIGINT)
        assert run.finish() == 130
    finally:
        run.close()
    log = (run.run_dir / "logs" / "srtr.log").read_text()
    for text in (run.err, log):
        assert "Traceback" not in text and "Too many open files" not in text


def test_adopt_refuses_a_live_job_even_with_a_stale_heartbeat(tmp_path: Path) -> None:
    run = Run(tmp_path, FLAKY)
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        # The controller cannot beat (stopped: as mute as under a full disk), its heartbeat
        # goes stale; it still holds the lock, and adopt must not start a second one.
        os.kill(run.proc.pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: (
                    "gone" not in _status(run.run_dir).stdout
                    and "heartbeat written not" in _status(run.run_dir).stdout
                ),
                30,
                "the heartbeat to go stale",
            )
            status = _status(run.run_dir)
            assert "controller=running" in status.stdout and "crashed" not in status.stdout
            adopt = subprocess.run(
                [sys.executable, "-m", "srtr", "up", "--adopt", str(run.run_dir), "--headless"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)
        assert adopt.returncode == 2, adopt.stderr
        lines = adopt.stderr.strip().splitlines()
        assert len(lines) == 1 and "controller.lock" in lines[0], adopt.stderr
        assert "Traceback" not in adopt.stderr
        run.signal(signal.SIGINT)
        assert run.finish() == 130
    finally:
        run.close()
