"""The control channel from any host: TLS with a pinned certificate, a token, a heartbeat.

`srtr status`, `srtr down` and `srtr tui` decide liveness from the controller's heartbeat
(and the SLURM job's state), never from a pid, and reach the controller over TCP + TLS with
the 0600 control.json; the Unix socket is only a same-host fast path (issue 22, part 2).
Another host is stood for by another mount and pid namespace with a private /tmp, where the
controller's pid does not exist and the run dir is seen at another path.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common import another_host
from srtr.net import certs
from srtr.runtime import control
from srtr.runtime.control import ControlError, ControlServer, Unreachable, send
from srtr.store import rundir
from tests.support.e2e_util import Run, wait_for

SLEEPERS = """
name: remote
services:
  - name: srv
    command: ["sleep", "1000"]
    nodes: 2
    stop_grace_seconds: 2
"""

ROOT = os.geteuid() == 0 and shutil.which("unshare") is not None


def long_run_dir(tmp_path: Path) -> Path:
    """A run dir whose control.sock would not fit a socket address (> 100 characters)."""
    run_dir = tmp_path / ("d" * 60) / ("e" * 40) / "run"
    assert len(str(run_dir.resolve() / "control.sock")) > 100
    return run_dir


def elsewhere(run_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m srtr ARGV...` as from another host: a new mount and pid namespace, a
    private /tmp, the run dir seen at another path (`{}` in argv). No pid of this host exists
    there and no socket of this /tmp can be reached."""
    view = Path("/mnt") / f"srtr-elsewhere-{os.getpid()}"
    view.mkdir(exist_ok=True)
    command = " ".join(a.replace("{}", str(view)) for a in argv)
    return subprocess.run(
        another_host(run_dir, view, command),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.e2e
@pytest.mark.skipif(not ROOT, reason="needs root and unshare for another namespace")
def test_status_and_down_work_from_another_host_with_a_long_run_dir(tmp_path: Path) -> None:
    run_dir = long_run_dir(tmp_path)
    run = Run(tmp_path, SLEEPERS, "--adopt-window", "1", run_dir=run_dir)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        assert "control" not in state["job"]  # no socket: TCP is the only way in
        assert not list(Path("/tmp").glob(f"srtr-{os.getuid()}-*.sock"))
        credentials = run_dir / control.CONTROL_FILE
        assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
        assert stat.S_IMODE((run_dir / certs.KEY_FILE).stat().st_mode) == 0o600
        first = json.loads((run_dir / rundir.HEARTBEAT_FILE).read_text())["ts"]
        wait_for(
            lambda: json.loads((run_dir / rundir.HEARTBEAT_FILE).read_text())["ts"] > first,
            10,
            "the heartbeat to be refreshed",
        )

        status = elsewhere(run_dir, "status", "{}")
        assert status.returncode == 0, status.stderr
        assert "controller=running (last heartbeat" in status.stdout, status.stdout

        down = elsewhere(run_dir, "down", "{}")
        assert down.returncode == 0, down.stderr
        assert "tearing down tier by tier" in down.stdout
        assert run.finish() == 143
        beat = json.loads((run_dir / rundir.HEARTBEAT_FILE).read_text())
        assert beat["stopped"] is True
        assert not credentials.exists()  # the token died with its controller
    finally:
        run.close()


def decoy_run_dir(tmp_path: Path, decoy: int, **job: object) -> Path:
    """A run dir whose state.json says Running with `decoy` as its controller's pid, and no
    controller behind it (none beats, no control.json)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    doc = {
        "job": {
            "name": "ghost",
            "backend": "local",
            "phase": "Running",
            "exit_code": None,
            "generation": 1,
            "observed_generation": 1,
            "controller_pid": decoy,
            **job,
        }
    }
    (run_dir / "state.json").write_text(json.dumps(doc))
    return run_dir


def srtr(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *argv], capture_output=True, text=True, env=env, timeout=60
    )


def test_down_never_signals_the_recorded_pid(tmp_path: Path) -> None:
    """The recorded pid is someone else's process here (another host's pid, reused): `srtr
    down` says it cannot reach the job and leaves that process alone (exit 1)."""
    decoy = subprocess.Popen(["sleep", "100"])
    try:
        run_dir = decoy_run_dir(tmp_path, decoy.pid)
        down = srtr("down", str(run_dir))
        assert down.returncode == 1, down
        assert "not running (no control.json)" in down.stderr
        assert "no heartbeat" in down.stderr
        status = srtr("status", str(run_dir))
        assert "controller=gone (no heartbeat)" in status.stdout
        # srtr down has exited: a SIGTERM it sent would have been delivered by now.
        assert decoy.poll() is None, "srtr down signalled a pid"
    finally:
        decoy.kill()
        decoy.wait()


def test_down_offers_scancel_of_srtrs_own_slurm_job(tmp_path: Path) -> None:
    """A SLURM job whose controller cannot be reached: its heartbeat's age, the job's state
    from squeue, and `scancel <id>` as the way out."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text('#!/bin/sh\n[ "$3" = 4242 ] && echo RUNNING\n')
    squeue.chmod(0o755)
    run_dir = decoy_run_dir(tmp_path, 1, backend="slurm", slurm_job_id="4242")
    beat = {"ts": time.time() - 90, "period": 1.0, "host": "node7", "machine": "x", "pid": 9}
    (run_dir / rundir.HEARTBEAT_FILE).write_text(json.dumps({**beat, "stopped": False}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    down = srtr("down", str(run_dir), env=env)
    assert down.returncode == 1, down
    assert re.search(r"last heartbeat 9\ds ago on node7; SLURM job 4242: RUNNING", down.stderr)
    assert "`scancel 4242`" in down.stderr
    status = srtr("status", str(run_dir), env=env)
    assert re.search(
        r"controller=silent \(last heartbeat 9\ds ago on node7; SLURM job 4242: RUNNING\)",
        status.stdout,
    )


@pytest.mark.e2e
def test_a_killed_controller_is_unreachable_and_its_job_can_be_adopted_at_once(
    tmp_path: Path,
) -> None:
    """kill -9: control.json stays behind, its address refuses; `srtr down` says so (exit
    1). On the controller's own machine its dead pid is believed at once, so `srtr up
    --adopt` need not wait for the heartbeat to go stale."""
    run = Run(tmp_path, SLEEPERS, "--adopt-window", "30", run_dir=long_run_dir(tmp_path))
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        run.proc.kill()
        run.proc.wait()
        down = srtr("down", str(run.run_dir))
        assert down.returncode == 1, down
        assert "cannot reach the controller" in down.stderr
        assert "last heartbeat" in down.stderr
        second = run.adopt()
        state = run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and s["job"]["phase"] == "Running",
            60,
            "the adopter",
        )
        assert state["job"]["controller_pid"] == second.pid
        down = srtr("down", str(run.run_dir))
        assert down.returncode == 0, down.stderr
        second.wait(60)
        wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")
    finally:
        run.close()


# -- the channel itself, in process ----------------------------------------------------------


class Served:
    """A ControlServer on a run dir with no socket (TCP + TLS only), answering `echo`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.cert = certs.for_job(run_dir)
        self.calls: list[str] = []

    def handler(self, op: str, instance: str | None, node: str | None) -> str:
        self.calls.append(op)
        if op != "echo":
            raise ValueError(f"no op {op}")
        return f"echo {instance}"

    def server(self) -> ControlServer:
        return ControlServer(
            self.run_dir,
            self.handler,
            ValueError,
            context=self.cert.server_context(),
            fingerprint=self.cert.fingerprint,
            hosts=["127.0.0.1"],
        )


def test_the_tcp_channel_pins_the_certificate_and_checks_the_token(tmp_path: Path) -> None:
    run_dir = long_run_dir(tmp_path)
    run_dir.mkdir(parents=True)
    served = Served(run_dir)

    async def scenario() -> None:
        server = served.server()
        await server.start()
        try:
            assert server.path is None
            good = control.read_credentials(run_dir)
            assert good is not None and good.fingerprint.startswith("sha256:")
            assert await asyncio.to_thread(send, run_dir, "echo", "x") == "echo x"
            with pytest.raises(ControlError, match="no op nope"):
                await asyncio.to_thread(send, run_dir, "nope")
            # Another job's certificate: the client hangs up before it sends anything.
            other = certs.create(tmp_path / "o.crt", tmp_path / "o.key")
            write(run_dir, good, fingerprint=other.fingerprint)
            with pytest.raises(Unreachable, match="not the job's"):
                await asyncio.to_thread(send, run_dir, "echo", "y")
            write(run_dir, good, token="guessed")
            with pytest.raises(ControlError, match="wrong credential"):
                await asyncio.to_thread(send, run_dir, "echo", "z")
        finally:
            await server.close()
        assert served.calls == ["echo", "nope"]
        with pytest.raises(Unreachable, match=r"no control\.json"):
            send(run_dir, "echo")

    asyncio.run(scenario())


def write(run_dir: Path, base: control.Credentials, **changes: str) -> None:
    fields = {
        "addresses": base.addresses,
        "token": base.token,
        "fingerprint": base.fingerprint,
        "socket": None,
        **changes,
    }
    (run_dir / control.CONTROL_FILE).write_text(json.dumps(fields))


def test_a_fresh_heartbeat_of_a_job_slurm_has_ended_is_not_running(tmp_path: Path) -> None:
    """Liveness is the heartbeat together with the SLURM job's state: a job SLURM lists as
    CANCELLED is not running, however fresh its controller's last beat."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho CANCELLED\n")
    squeue.chmod(0o755)
    run_dir = decoy_run_dir(tmp_path, 1, backend="slurm", slurm_job_id="77")
    beat = {"ts": time.time() + 60, "period": 1.0, "host": "node2", "machine": "x", "pid": 9}
    (run_dir / rundir.HEARTBEAT_FILE).write_text(json.dumps({**beat, "stopped": False}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    status = srtr("status", str(run_dir), env=env)
    assert "controller=gone (last heartbeat 0.0s ago on node2; SLURM job 77: CANCELLED)" in (
        status.stdout
    ), status.stdout
    squeue.write_text("#!/bin/sh\necho RUNNING\n")
    status = srtr("status", str(run_dir), env=env)
    assert "controller=running (" in status.stdout, status.stdout
