"""The run dir is its owner's: another local user who gets a hand on its path (a pre-created
dir, a swapped one, a planted control.json, lock or socket, a predictable /tmp dir) gets
nothing from the job."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from srtr.resources.errors import RecipeError
from srtr.runtime import control, run_dir_owner, run_lock
from tests.support.control_util import loopback_control
from tests.support.e2e_util import wait_for
from tests.support.security_util import Attacker, attacker  # noqa: F401 - the fixture

RECIPE = 'name: r\nservices:\n  - name: a\n    command: ["sleep", "1"]\n'


def _as(attacker: Attacker, script: str, *args: str) -> None:  # noqa: F811
    attacker.run(script, *args)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the attacker may write, as a group-writable project dir is (under /tmp:
    pytest's own tmp dirs are root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="srtr-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_pre_created_run_dir_of_another_user_is_refused_in_one_line(
    attacker: Attacker,  # noqa: F811
    shared: Path,
    tmp_path: Path,
) -> None:
    theirs = shared / "run"
    _as(attacker, "import os, sys; os.mkdir(sys.argv[1], 0o777)", str(theirs))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "up", str(recipe), "--run-dir", str(theirs), "--headless"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "belongs to another user" in lines[0], done.stderr
    assert os.listdir(theirs) == []  # nothing of the job went there


def test_the_run_dir_and_its_new_parents_are_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        run_dir_owner.make_private(tmp_path / "outputs" / "job-1")
    finally:
        os.umask(old)
    for path in (tmp_path / "outputs", tmp_path / "outputs" / "job-1"):
        assert path.stat().st_mode & 0o777 == 0o700


def test_a_link_as_run_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(RecipeError, match="symbolic link"):
        run_dir_owner.make_private(tmp_path / "link")


def test_a_swapped_run_dir_gets_nothing(
    attacker: Attacker,  # noqa: F811
    shared: Path,
    tmp_path: Path,
) -> None:
    """The run dir vanished; before srtr recreates it another user puts her own dir, or a link
    to a file of the owner's, at its path: srtr uses neither."""
    run_dir = shared / "run"
    _as(attacker, "import os, sys; os.mkdir(sys.argv[1], 0o777)", str(run_dir))
    with pytest.raises(FileExistsError):
        run_dir_owner.recreate(run_dir)
    assert os.listdir(run_dir) == []
    os.rmdir(run_dir)
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("owner's\n")
    _as(attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(bashrc), str(run_dir))
    with pytest.raises(FileExistsError):
        run_dir_owner.recreate(run_dir)
    assert bashrc.read_text() == "owner's\n"


def test_a_planted_control_json_and_socket_are_not_trusted(
    attacker: Attacker,  # noqa: F811
    shared: Path,
    tmp_path: Path,
) -> None:
    # Another user's listener at a socket path, named by a control.json that is ours...
    listener = """
        import os, socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.bind(sys.argv[1])
        os.chmod(sys.argv[1], 0o777)
        s.listen(1)
        print("ready", flush=True)
        conn, _ = s.accept()
        conn.sendall(b'{"ok": true, "message": "stopping (a lie)"}\\n')
        conn.recv(4096)
    """
    path = shared / "control.sock"
    proc = attacker.start(listener, str(path))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        creds = control.Credentials(addresses=[], token="t", fingerprint="f", socket=str(path))
        assert control._send_unix(creds, {"op": "down"}, 5.0) is None  # not our controller
    finally:
        proc.kill()
        proc.wait()
    # ...and a control.json another user wrote is not read at all.
    planted = shared / "planted"
    planted.mkdir()
    planted.chmod(0o777)
    doc = json.dumps({"addresses": ["127.0.0.1:1"], "token": "x", "fingerprint": "y"})
    _as(
        attacker,
        "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        str(planted / control.CONTROL_FILE),
        doc,
    )
    assert control.read_credentials(planted) is None


def test_a_planted_lock_file_is_refused(
    attacker: Attacker,  # noqa: F811
    shared: Path,
    tmp_path: Path,
) -> None:
    _as(attacker, "import sys; open(sys.argv[1], 'w').close()", str(shared / run_lock.LOCK_FILE))
    with pytest.raises(RecipeError, match="not a file of yours"):
        run_lock.hold(shared)


def test_the_lock_is_held_for_life_and_seen_by_others(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from srtr.runtime import run_lock; "
            "run_lock.hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert run_lock.holder(tmp_path) == f"pid {holder.pid} holds {run_lock.LOCK_FILE}"
        with pytest.raises(run_lock.LockHeld):
            run_lock.hold(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    # the kernel lets go with the process
    wait_for(lambda: run_lock.holder(tmp_path) is None, 10, "the lock to be released")
    run_lock.hold(tmp_path)
    run_lock.release(tmp_path)


def test_the_gms_socket_dir_is_refused_when_another_user_made_it(
    attacker: Attacker,  # noqa: F811
    tmp_path: Path,
) -> None:
    from srtr.resources.kinds import gms

    base = f"/tmp/srtr-gms-test-{os.getpid()}"
    _as(attacker, "import os, sys; os.mkdir(sys.argv[1], 0o777)", base)
    try:
        done = subprocess.run(
            ["bash", "-c", gms._OWN_DIR + f'\nown_dir "{base}/job/agg-0-0"'],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1 and "not this user's own directory" in done.stderr
        assert os.listdir(base) == []
    finally:
        subprocess.run(["rm", "-rf", base], check=True)
    mine = subprocess.run(
        ["bash", "-c", gms._OWN_DIR + f'\nown_dir "{base}/job/agg-0-0" && stat -c %a "{base}"'],
        capture_output=True,
        text=True,
    )
    subprocess.run(["rm", "-rf", base], check=True)
    assert mine.returncode == 0 and mine.stdout.strip() == "700"


def test_socket_peer_uid_is_read() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert control._peer_uid(a) == os.getuid()


def test_adopt_of_a_damaged_run_dir_is_one_line(tmp_path: Path) -> None:
    """A run dir whose state.json lacks what adoption reads: one line, exit 2, no traceback."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "recipe.yaml").write_text(RECIPE)
    doc = {"version": 1, "job": {"name": "r", "backend": "local", "phase": "Running"}}
    (run_dir / "state.json").write_text(json.dumps(doc))
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "up", "--adopt", str(run_dir), "--headless"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{run_dir}:"), done.stderr


def test_status_of_a_locked_job_with_a_full_disk_says_running_not_crashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller holds its lock but cannot write its heartbeat (ENOSPC): status says
    what it knows, never "controller crashed; adopt"."""
    from types import SimpleNamespace

    from srtr.cli.crash import crash_line
    from srtr.runtime import liveness
    from srtr.store.rundir import RunState, machine_id

    run_dir = tmp_path
    beat = {"ts": time.time() - 120, "period": 1.0, "host": "h", "machine": machine_id()}
    (run_dir / "heartbeat.json").write_text(json.dumps({**beat, "pid": 1, "stopped": False}))
    state = RunState.from_doc({"job": {"name": "r", "phase": "Running", "controller_pid": 1}})
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from srtr.runtime import run_lock; "
            "run_lock.hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(liveness.os, "statvfs", lambda path: SimpleNamespace(f_bavail=0))
        seen = liveness.check(run_dir, state, slurm=False)
        assert seen.running and seen.word() == "running"
        assert "heartbeat written not for" in seen.describe() and "ENOSPC" in seen.describe()
        assert crash_line(run_dir, state) is None
    finally:
        holder.kill()
        holder.wait()
    assert crash_line(run_dir, state) is not None  # gone for real: now it may say so


def test_a_controller_that_answers_is_not_gone(tmp_path: Path) -> None:
    """Across hosts the lock may not be seen and the heartbeat may be stale: adopt asks the
    control channel first, and any answer means a controller lives."""
    import asyncio

    from srtr.net import certs

    assert not run_lock.answering(tmp_path)  # no control.json: nobody to ask
    cert = certs.create(tmp_path / "job.crt", tmp_path / "job.key")

    def handler(op: str, instance: str | None, node: str | None) -> str:
        raise ValueError(f"unknown intent {op!r}")

    async def body() -> bool:
        async with loopback_control(tmp_path, handler, cert):
            return await asyncio.to_thread(run_lock.answering, tmp_path)

    assert asyncio.run(body())


def test_a_log_planted_as_a_link_is_not_followed(tmp_path: Path) -> None:
    """A link at an instance's log name (to the owner's ~/.bashrc): the launch is refused
    with the reason, and the file it points at is untouched."""
    from srtr.backends.base import LaunchError
    from srtr.backends.spawn import open_log as _open_log

    bashrc = tmp_path / "bashrc"
    bashrc.write_text("owner's\n")
    log = tmp_path / "logs" / "service_a.out"
    log.parent.mkdir()
    log.symlink_to(bashrc)
    with pytest.raises(LaunchError, match="cannot open log"):
        _open_log(log)
    assert bashrc.read_text() == "owner's\n"
