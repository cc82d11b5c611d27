"""Storage faults never cost srtr control of its job (issue 16), on real faults, not mocks.

Each test runs a real `srtr up` on the local backend and breaks its run dir while the job
runs: a full tmpfs, RLIMIT_FSIZE on the srtr process, a read-only bind mount, `rm -rf`. The
job must keep running, an intent sent during the fault must act, the events written once
writes work again must be complete and in order, SIGTERM must tear everything down and
`srtr up` exit 143 in seconds, and stderr must hold no traceback.

Mounting needs root. Without it, RLIMIT_FSIZE (which needs nothing) stands in for the full
disk and the read-only mount, so nothing skips.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from srtr.runtime.control import send
from tests.support.e2e_util import Run, events, instance, processes_with, read_state, wait_for
from tests.support.pty_util import PtyProgram

pytestmark = pytest.mark.e2e

# An owner that only sleeps, and a rider that restarts ~8 times a second: events flow all
# the time, so every file of the run dir is written while the fault lasts. Each attempt of
# the rider adds a line to a trace file outside the run dir, which is how a test sees it
# restart without the run dir's files (and without sampling /proc for a 50 ms process).
RECIPE = """
name: faults
services:
  - name: owner
    nodes: 1
    command: ["sleep", "1000"]
  - name: chatty
    placement: {pool: owner}
    command: ["bash", "-c", "echo chatty attempt; echo $$ >> $TRACE; sleep 0.05; exit 1"]
    env: {TRACE: "@TRACE@"}
    restart: {policy: always, backoff_seconds: 0.05, max_backoff_seconds: 0.05,
              max_restarts: 1000000, window_seconds: 3600}
"""


def recipe(tmp_path: Path, text: str = RECIPE) -> str:
    return text.replace("@TRACE@", str(tmp_path / "chatty.trace"))


def attempts(tmp_path: Path) -> int:
    """How many attempts of the rider have started (from its trace file)."""
    try:
        return (tmp_path / "chatty.trace").read_text().count("\n")
    except FileNotFoundError:
        return 0


def wait_restarts(
    tmp_path: Path, count: int = 3, pump: Callable[[], object] = lambda: None
) -> None:
    """The rider goes on restarting: `count` more attempts start."""
    target = attempts(tmp_path) + count
    wait_for(lambda: pump() or attempts(tmp_path) >= target, 10, "the rider to restart")


ROOT = Path(__file__).resolve().parents[3]
FSIZE_LIMIT = 24 * 1024  # events.jsonl reaches it in a few seconds; state.json stays under it
# Both instances stop at SIGTERM at once: seconds, not graces. A bound on the wait for the
# exit, not a timed assertion: speed is measured in benchmarks/.
TEARDOWN_BOUND = 10.0
CHATTY_CYCLE = ("Exited", "BackOff", "Restarting", "Launched")


# --- faults ------------------------------------------------------------------------------------


def _mount(*args: str) -> bool:
    done = subprocess.run(["mount", *args], capture_output=True, check=False)
    return done.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


_CAN_MOUNT: list[bool] = []


def can_mount(tmp_path: Path) -> bool:
    """Root with the right to mount here (checked once, with a tmpfs that is unmounted)."""
    if not _CAN_MOUNT:
        probe = tmp_path / "mount-probe"
        probe.mkdir()
        ok = os.geteuid() == 0 and _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
        if ok:
            _umount(probe)
        # SRTR_TEST_NO_MOUNT=1 runs the stand-ins as root.
        _CAN_MOUNT.append(ok and not os.environ.get("SRTR_TEST_NO_MOUNT"))
    return _CAN_MOUNT[0]


class Fault:
    """How a test breaks the run dir: `start`, `clear` (writes work again), `cleanup`."""

    name = ""
    file = ""  # the file whose WriteFailing / WriteRecovered the test waits for
    errno_name = ""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def run_args(self) -> dict[str, Any]:
        return {}

    def start(self, run: Run) -> None:
        return None

    def clear(self, run: Run) -> None:
        return None

    def cleanup(self) -> None:
        return None


class DiskFull(Fault):
    """The run dir on a 4 MB tmpfs, filled to the last block; deleting the filler clears it."""

    name, file, errno_name = "full", "events.jsonl", "ENOSPC"

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.disk = tmp_path / "disk"
        self.disk.mkdir()
        assert _mount("-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(self.disk))

    def run_args(self) -> dict[str, Any]:
        return {"run_dir": self.disk / f"run-{uuid.uuid4().hex[:8]}"}

    def start(self, run: Run) -> None:
        self.start_filling()

    def start_filling(self) -> None:
        with open(self.disk / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        assert shutil.disk_usage(self.disk).free < 65536

    def clear(self, run: Run) -> None:
        (self.disk / "filler").unlink()

    def cleanup(self) -> None:
        _umount(self.disk)


class FileSizeLimit(Fault):
    """RLIMIT_FSIZE on `srtr up` (set before exec); raising it (prlimit) clears the fault."""

    name, file, errno_name = "fsize", "events.jsonl", "EFBIG"

    def run_args(self) -> dict[str, Any]:
        def limit() -> None:
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, hard))

        return {"preexec": limit}

    def clear(self, run: Run) -> None:
        _, hard = resource.prlimit(run.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(run.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))


class ReadOnly(Fault):
    """The run dir bound read-only over itself; unmounting clears it.

    Files srtr already has open (events.jsonl, srtr.log) stay writable through their open
    descriptors, which belong to the read-write mount: what fails is every new file
    (state.json's temp file, an instance's log opened for a new attempt).
    """

    name, file, errno_name = "readonly", "state.json", "EROFS"
    run_dir: Path | None = None

    def start(self, run: Run) -> None:
        path = str(run.run_dir)
        assert _mount("--bind", path, path)
        self.run_dir = run.run_dir
        # EBUSY while a file opened through the new mount is open for writing (a rider's log
        # for the attempt that started in between): try again once it has exited.
        wait_for(lambda: _mount("-o", "remount,ro,bind", path), 10, "a read-only remount")

    def clear(self, run: Run) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        if self.run_dir is not None:
            _umount(self.run_dir)
            self.run_dir = None


def make_fault(kind: str, tmp_path: Path) -> Fault:
    if kind != "fsize" and not can_mount(tmp_path):
        return FileSizeLimit(tmp_path)  # the stand-in without the right to mount
    return {"full": DiskFull, "fsize": FileSizeLimit, "readonly": ReadOnly}[kind](tmp_path)


# --- watching the job without its files -----------------------------------------------------


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def pids_running(run: Run, command: str) -> set[int]:
    """The run's live processes whose command line starts with `command` (from /proc)."""
    return {pid for pid in run.leftovers() if cmdline(pid).startswith(command)}


def alive(pid: int) -> bool:
    stat_line = Path(f"/proc/{pid}/stat")
    try:
        return ") Z " not in stat_line.read_text()
    except OSError:
        return False


def failing_line(run: Run, file: str) -> bool:
    """The fault was reported: its progress line is on stderr (the disk cannot show it)."""
    # Progress lines pad the reason to one width (REASON_WIDTH), as the TUI's events do.
    line = re.compile(rf"WriteFailing +job: cannot write {re.escape(file)}: ")
    return line.search(run.stderr_so_far()) is not None


def recovered(run: Run, file: str) -> bool:
    return any(
        e["reason"] == "WriteRecovered" and e["message"].startswith(f"{file} is written again")
        for e in events(run.run_dir)
    )


def kill_leftovers(run: Run) -> None:
    for pid in run.leftovers():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def check_events_complete(run_dir: Path) -> list[dict[str, Any]]:
    """events.jsonl: no torn line, in time order, and no event of the rider missing."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    log = [json.loads(line) for line in lines]  # a torn line would not parse
    stamps = [e["ts"] for e in log]
    assert stamps == sorted(stamps)
    chatty = [e for e in log if e["object"] == "instance/service_chatty"]
    reasons = [e["reason"] for e in chatty]
    assert reasons[0] == "Launched", reasons[:5]
    for at, reason in enumerate(reasons[1:]):
        assert reason == CHATTY_CYCLE[at % len(CHATTY_CYCLE)], (at, reasons[at - 3 : at + 4])
    attempts = [
        int(m.group(1))
        for e in chatty
        if e["reason"] == "Restarting" and (m := re.search(r"attempt (\d+)", e["message"]))
    ]
    assert attempts == list(range(1, len(attempts) + 1))
    return log


def first(log: list[dict[str, Any]], reason: str, text: str) -> int:
    return next(i for i, e in enumerate(log) if e["reason"] == reason and text in e["message"])


def stop_by_sigterm(run: Run) -> None:
    run.signal(signal.SIGTERM)
    assert run.finish(timeout=TEARDOWN_BOUND) == 143


def assert_clean_end(run: Run) -> None:
    assert "Traceback" not in run.err, run.err
    assert not run.leftovers()


# --- the tests ----------------------------------------------------------------------------------


def _during_the_fault(run: Run, fault: Fault, owner: int) -> int:
    """The job runs on, and a restart sent through the control socket acts. The new owner."""
    wait_for(lambda: failing_line(run, fault.file), 30, f"{fault.file} reported failing")
    assert alive(owner)
    wait_restarts(fault.tmp_path)
    assert send(run.run_dir, "restart", "service_owner") == "restarting service_owner"
    new = wait_for(lambda: pids_running(run, "sleep 1000") - {owner}, 20, "a new owner")
    assert not alive(owner)
    return new.pop()


@pytest.mark.parametrize("kind", ["full", "fsize", "readonly"])
def test_a_write_fault_never_costs_srtr_its_job(tmp_path: Path, kind: str) -> None:
    fault = make_fault(kind, tmp_path)
    run: Run | None = None
    try:
        run = Run(tmp_path, recipe(tmp_path), **fault.run_args())
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        owner = instance(state, "service_owner")["pid"]
        fault.start(run)
        new_owner = _during_the_fault(run, fault, owner)
        if isinstance(fault, FileSizeLimit):
            _check_status_shows_the_fault(run)
        fault.clear(run)
        wait_for(lambda: recovered(run, fault.file), 30, f"{fault.file} written again")
        assert alive(new_owner)
        log = check_events_complete(run.run_dir)
        failing = first(log, "WriteFailing", f"cannot write {fault.file}: {fault.errno_name}")
        restart = first(log, "RestartRequested", "")
        back = first(log, "WriteRecovered", f"{fault.file} is written again")
        assert failing < restart < back
        assert log[restart]["object"] == "instance/service_owner"
        stop_by_sigterm(run)
        final = run.state()  # before the tmpfs goes
    finally:
        if run is not None:
            run.close()
            kill_leftovers(run)
        fault.cleanup()
    assert_clean_end(run)
    assert final is not None and final["job"]["exit_code"] == 143
    assert final["job"]["phase"] == "Failed" and final["job"]["write_faults"] == []


def _check_status_shows_the_fault(run: Run) -> None:
    """state.json (small, under the limit) is still written: it says what fails."""
    state = run.wait_state(lambda s: s["job"]["write_faults"], 10, "write_faults in state.json")
    faults = {f["file"]: f for f in state["job"]["write_faults"]}
    assert faults["events.jsonl"]["errno"] == "EFBIG"
    shown = subprocess.run(
        [sys.executable, "-m", "srtr", "status", str(run.run_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "cannot write events.jsonl: EFBIG" in shown


def test_a_vanished_run_dir_is_recreated_and_the_job_stays_in_control(tmp_path: Path) -> None:
    run = Run(tmp_path, recipe(tmp_path))
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        owner = instance(state, "service_owner")["pid"]
        assert Path(state["job"]["control"]).parent == run.run_dir.resolve()
        # `rm -rf` of the run dir, made atomic (a rename first) so that srtr cannot recreate
        # it while rm is still walking it, which would leave half of both.
        gone = tmp_path / "gone"
        os.rename(run.run_dir, gone)
        subprocess.run(["rm", "-rf", str(gone)], check=True)
        wait_for(
            lambda: any(e["reason"] == "RunDirRecreated" for e in events(run.run_dir)),
            10,
            "the run dir recreated",
        )
        assert stat.S_IMODE(run.run_dir.stat().st_mode) == 0o700
        wait_for(lambda: (run.run_dir / "recipe.yaml").exists(), 10, "the recipe rewritten")
        wait_for(lambda: Path(state["job"]["control"]).exists(), 10, "the socket listens again")
        assert alive(owner)
        assert send(run.run_dir, "restart", "service_owner") == "restarting service_owner"
        wait_for(lambda: pids_running(run, "sleep 1000") - {owner}, 20, "a new owner")
        log = check_events_complete_after(run.run_dir)
        assert first(log, "RunDirRecreated", "") < first(log, "RestartRequested", "")
        stop_by_sigterm(run)
    finally:
        run.close()
        kill_leftovers(run)
    assert_clean_end(run)
    final = run.state()
    assert final is not None and final["job"]["exit_code"] == 143
    assert "RunDirRecreated" in run.err  # the warning is on stderr as well


def check_events_complete_after(run_dir: Path) -> list[dict[str, Any]]:
    """The new events.jsonl: whole lines in time order (what came before is gone with rm)."""
    log = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["ts"] for e in log] == sorted(e["ts"] for e in log)
    return log


def test_two_sigints_kill_at_once_on_a_full_disk(tmp_path: Path) -> None:
    term = tmp_path / "got-term"
    deaf = RECIPE.replace(
        '["sleep", "1000"]',
        f'["bash", "-c", "trap \'echo x >> {term}\' TERM; while true; do sleep 0.1; done"]'
        "\n    stop_grace_seconds: 600",
    )
    fault = make_fault("full", tmp_path)
    run: Run | None = None
    try:
        run = Run(tmp_path, recipe(tmp_path, deaf), **fault.run_args())
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        fault.start(run)
        wait_for(lambda: failing_line(run, fault.file), 30, f"{fault.file} reported failing")
        run.signal(signal.SIGINT)
        wait_for(term.exists, 10, "the owner got its SIGTERM")  # the teardown began
        run.signal(signal.SIGINT)
        assert run.finish(timeout=TEARDOWN_BOUND) == 130
    finally:
        if run is not None:
            run.close()
            kill_leftovers(run)
        fault.cleanup()
    assert_clean_end(run)


@pytest.mark.parametrize(("how", "code"), [("down", 143), ("SIGHUP", 129)])
def test_srtr_down_and_sighup_work_on_a_full_disk(tmp_path: Path, how: str, code: int) -> None:
    fault = make_fault("full", tmp_path)
    run: Run | None = None
    try:
        run = Run(tmp_path, recipe(tmp_path), **fault.run_args())
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        fault.start(run)
        wait_for(lambda: failing_line(run, fault.file), 30, f"{fault.file} reported failing")
        if how == "SIGHUP":
            run.signal(signal.SIGHUP)
        else:  # reads the stale state.json, asks through the control socket
            down = subprocess.run(
                [sys.executable, "-m", "srtr", "down", str(run.run_dir)],
                capture_output=True,
                text=True,
                check=False,
            )
            assert down.returncode == 0, down.stderr
            assert "tearing down" in down.stdout
        assert run.finish(timeout=TEARDOWN_BOUND) == code
    finally:
        if run is not None:
            run.close()
            kill_leftovers(run)
        fault.cleanup()
    assert_clean_end(run)


def test_the_tuis_keys_work_on_a_full_disk(tmp_path: Path) -> None:
    """`srtr up` on a terminal: the TUI reads the run dir, which no longer changes, and its
    Ctrl+C twice (an intent through the control socket) still ends the job with 130."""
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(recipe(tmp_path))
    mounted = can_mount(tmp_path)
    fault = DiskFull(tmp_path) if mounted else None
    base = fault.disk if fault is not None else tmp_path
    run_dir = base / f"run-{uuid.uuid4().hex[:8]}"
    marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0"
    argv = [sys.executable, "-m", "srtr", "up", str(recipe_file), "--run-dir", str(run_dir)]
    # This checkout's srtr, whatever the cwd (a relative PYTHONPATH would miss it there).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    program = PtyProgram(argv, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path})
    try:
        program.wait_for_text("service_chatty")
        wait_for(lambda: (s := read_state(run_dir)) and s["job"]["phase"] == "Running", 30)
        if fault is not None:
            fault.start_filling()
        else:  # the stand-in: no file of srtr up may grow any more
            _, hard = resource.prlimit(program.proc.pid, resource.RLIMIT_FSIZE)
            size = (run_dir / "events.jsonl").stat().st_size
            resource.prlimit(program.proc.pid, resource.RLIMIT_FSIZE, (size, hard))
        # The rider restarts on; events.jsonl, once the slack of its last page is used up
        # (tmpfs), no longer grows: the job runs while its events cannot be written.
        wait_restarts(tmp_path, 10, pump=program.pump)
        size = (run_dir / "events.jsonl").stat().st_size
        wait_restarts(tmp_path, pump=program.pump)
        assert (run_dir / "events.jsonl").stat().st_size == size
        program.send(b"\x03")
        program.wait_for_text("Tear the job down?")
        program.send(b"\x03")
        assert program.wait(30) == 130, program.text()
        wait_for(lambda: not processes_with(marker), 10, "every process of the run to be gone")
    finally:
        program.kill()
        for pid in processes_with(marker):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if fault is not None:
            fault.cleanup()
    assert "Traceback" not in program.raw.decode(errors="replace")


SLURM_RECIPE = """
name: sfull
services:
  - name: owner
    nodes: 2
    command: ["sleep", "1000"]
  - name: rider
    placement: {pool: owner}
    command: ["sleep", "1000"]
    shutdown_tier: 1
"""


@pytest.mark.slurm
def test_a_full_disk_under_a_slurm_job_tears_down_with_143(
    tmp_path: Path, slurm_cluster: dict[str, str]
) -> None:
    """The run dir (and so every step's log) on a full tmpfs that the controller and the
    test cluster's nodes share: SIGTERM still tears the steps down tier by tier, `srtr up`
    exits 143 and the allocation it made is released."""
    from tests.support import slurm_util

    # The SLURM test cluster runs as root (slurmd must), and root may mount a tmpfs here.
    assert can_mount(tmp_path), "the SLURM tests run as root, which may mount a tmpfs"
    fault = DiskFull(tmp_path)
    run: Run | None = None
    try:
        run = Run(
            tmp_path,
            SLURM_RECIPE,
            "--backend",
            "slurm",
            "--launcher",
            "step",  # one srun step per instance: the steps are what must tear down
            env=slurm_util.outside_env(),
            **fault.run_args(),
        )
        state = run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and all(i["step"] is not None for i in s["instances"])
            ),
            60,
            "every step registered",
        )
        job_id = state["job"]["slurm_job_id"]
        fault.start(run)
        # An idle job writes nothing: a restart (an intent, then steps) makes it write.
        rider = next(i["name"] for i in state["instances"] if i["service"] == "rider")
        send(run.run_dir, "restart", rider)
        # A few events may still fit in events.jsonl's last page; state.json's rewrite never.
        failing = "state.json"
        wait_for(lambda: failing_line(run, failing), 30, f"{failing} reported failing")
        assert slurm_util.squeue("-j", job_id), "the allocation went away with the disk"
        stop_by_sigterm(run)
    finally:
        if run is not None:
            run.close()
            kill_leftovers(run)
        fault.cleanup()
    assert_clean_end(run)
    wait_for(lambda: slurm_util.squeue("-n", "srtr-sfull") == "", 30, "the allocation released")
