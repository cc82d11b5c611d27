"""The guard's memory mirror of state.json: what a controller launched last is reaped even when
the run dir vanished before the guard ever read a state.json naming it (real processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from srtr.backends.procgroup import process_start_time
from srtr.runtime import guard
from tests.support.e2e_util import wait_for


def _doc(controller: int, victim: subprocess.Popen[bytes]) -> str:
    identity = {"pid": victim.pid, "start": process_start_time(victim.pid)}
    doc = {
        "job": {"phase": "Running", "controller_pid": controller, "backend": "local"},
        "instances": [{"name": "service_hold", "identity": identity}],
    }
    return json.dumps(doc)


def test_the_guard_reaps_what_only_the_mirror_knew(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # state.json from before the launch: no instances, so a disk-only guard would reap nothing.
    (run_dir / "state.json").write_text(json.dumps({"job": {"phase": "Running"}}))
    hold = [sys.executable, "-c", "import time; time.sleep(600)"]
    victim = subprocess.Popen(hold, start_new_session=True)
    # The stand-in controller: the guard watches its pid; it owns the mirror.
    controller = subprocess.Popen(hold)
    mirror = guard.StateMirror()
    mirror.write(_doc(controller.pid, victim))
    argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(controller.pid), "600"]
    watcher = subprocess.Popen([*argv, str(mirror.fd)], pass_fds=(mirror.fd,))
    try:
        controller.kill()
        controller.wait()
        for path in sorted(run_dir.rglob("*"), reverse=True):
            path.unlink()
        run_dir.rmdir()
        assert watcher.wait(timeout=60) == 0
        wait_for(lambda: victim.poll() is not None, 30, "the victim to be killed")
        assert victim.returncode == -9
    finally:
        for proc in (victim, controller, watcher):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        mirror.close()


def test_a_torn_mirror_falls_back_to_state_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hold = [sys.executable, "-c", "import time; time.sleep(600)"]
    victim = subprocess.Popen(hold, start_new_session=True)
    controller = subprocess.Popen(hold)
    (run_dir / "state.json").write_text(_doc(controller.pid, victim))
    mirror = guard.StateMirror()
    mirror.write('{"job": {"phase": "Runn')  # a kill -9 in the middle of a write
    argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(controller.pid), "0"]
    watcher = subprocess.Popen([*argv, str(mirror.fd)], pass_fds=(mirror.fd,))
    try:
        controller.kill()
        controller.wait()
        assert watcher.wait(timeout=60) == 0
        wait_for(lambda: victim.poll() is not None, 30, "the victim to be killed")
        assert victim.returncode == -9
    finally:
        for proc in (victim, controller, watcher):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        mirror.close()


def test_a_successor_beating_from_another_host_is_an_adoption(tmp_path: Path) -> None:
    """A controller that adopted the job from another host (a login node) has a pid that
    means nothing here: its heartbeat tells the guard, which leaves and kills nothing."""
    import time

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hold = [sys.executable, "-c", "import time; time.sleep(600)"]
    victim = subprocess.Popen(hold, start_new_session=True)
    controller = subprocess.Popen(hold)
    (run_dir / "state.json").write_text(_doc(controller.pid, victim))
    argv = [sys.executable, "-m", "srtr.runtime.guard", str(run_dir), str(controller.pid), "600"]
    watcher = subprocess.Popen(argv)
    try:
        # Dated ahead (a clock a little fast counts as fresh): fresh however slow the guard.
        beat = {"ts": time.time() + 30, "period": 1.0, "host": "login1", "machine": "other"}
        (run_dir / "heartbeat.json").write_text(json.dumps({**beat, "pid": 1, "stopped": False}))
        controller.kill()
        controller.wait()
        assert watcher.wait(timeout=60) == 0  # well within its 600 s window
        assert victim.poll() is None
    finally:
        for proc in (victim, controller, watcher):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
