"""The local backend against real processes: exits, signals, logs, env, groups, cleanup.

Every test runs its body through `run`, which closes the backend and then checks that no
process of any session the test started is left (leaders are session leaders, so a
grandchild shows up by its session id even when the test never learned its pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from srtr.backends.base import LaunchError, LaunchSpec, Observation, ObservationKind
from srtr.backends.local.backend import LocalBackend
from tests.support.e2e_util import wait_for_async as wait_for

WORKLOAD = str(Path(__file__).resolve().parents[2] / "support" / "workload.py")
PY = sys.executable
REPO = str(Path(__file__).resolve().parents[3])


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Fields after the parenthesised command name, which may itself contain spaces.
    return text.rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (a zombie's reaper may not be us)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def live_in_sessions(sessions: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # fields[0] is the state, fields[3] the session id.
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[3]) in sessions:
            found.append(int(entry))
    return found


class Harness:
    def __init__(self, tmp_path: Path, node_count: int) -> None:
        self.backend = LocalBackend(node_count)
        self.tmp = tmp_path
        self.observations: list[Observation] = []
        self.backend.set_listener(self.observations.append)
        self.sessions: set[int] = set()

    def log(self, name: str) -> Path:
        return self.tmp / "logs" / f"{name}.log"

    def log_text(self, name: str) -> str:
        path = self.log(name)
        return path.read_text() if path.exists() else ""

    def spec(
        self,
        name: str,
        argv: list[str],
        *,
        node: int = 1,
        attempt: int = 0,
        env: dict[str, str] | None = None,
        preamble: str | None = None,
        shell: bool = False,
        cwd: Path | None = None,
    ) -> LaunchSpec:
        info = self.backend.nodes()[node - 1]
        return LaunchSpec(
            name=name,
            node=info.name,
            node_ip=info.ip,
            argv=tuple(argv),
            env=env or {},
            log_path=self.log(name),
            attempt=attempt,
            preamble=preamble,
            shell=shell,
            cwd=cwd,
        )

    async def launch(self, name: str, argv: list[str], **kw: Any) -> int:
        pid = await self.backend.launch(self.spec(name, argv, **kw))
        self.sessions.add(pid)
        return pid

    def exits(self, name: str) -> list[Observation]:
        return [o for o in self.observations if o.name == name and o.kind is ObservationKind.EXITED]

    async def wait_exit(self, name: str, attempt: int = 0) -> Observation:
        def seen() -> bool:
            return any(o.attempt == attempt for o in self.exits(name))

        await wait_for(seen, what=f"{name} attempt {attempt} to exit")
        return next(o for o in self.exits(name) if o.attempt == attempt)

    async def wait_log(self, name: str, text: str) -> None:
        await wait_for(lambda: text in self.log_text(name), what=f"{text!r} in {name}'s log")

    async def close_and_check(self) -> None:
        await self.backend.close()
        assert self.backend.running() == set()
        await wait_for(
            lambda: not live_in_sessions(self.sessions), what="every test process to be gone"
        )


def run(tmp_path: Path, body: Callable[[Harness], Awaitable[None]], node_count: int = 3) -> None:
    async def main() -> None:
        harness = Harness(tmp_path, node_count)
        try:
            await body(harness)
        finally:
            await harness.close_and_check()

    asyncio.run(main())


def test_nodes_get_consecutive_loopback_ips() -> None:
    backend = LocalBackend(300)
    nodes = backend.nodes()
    assert backend.name == "local"
    assert [(n.name, n.ip) for n in nodes[:3]] == [
        ("node1", "127.0.0.2"),
        ("node2", "127.0.0.3"),
        ("node3", "127.0.0.4"),
    ]
    assert (nodes[253].name, nodes[253].ip) == ("node254", "127.0.0.255")
    assert (nodes[254].name, nodes[254].ip) == ("node255", "127.0.1.0")
    assert nodes[-1].ip == "127.0.1.45"
    with pytest.raises(ValueError):
        LocalBackend(0)


def test_exit_code_is_observed(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("job", [PY, WORKLOAD, "--exit-code", "3"])
        seen = await h.wait_exit("job")
        assert seen == Observation(
            kind=ObservationKind.EXITED,
            name="job",
            attempt=0,
            pid=pid,
            exit_code=3,
            signal=None,
            message="exited with code 3",
        )
        assert h.backend.running() == set()
        assert not pid_alive(pid)

    run(tmp_path, body)


def test_kill_signal_gives_128_plus_n(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("srv", [PY, WORKLOAD, "--print", "up", "--run-for", "inf"])
        await h.wait_log("srv", "up")
        assert h.backend.running() == {"srv"}
        await h.backend.signal("srv", signal.SIGKILL)
        seen = await h.wait_exit("srv")
        assert (seen.exit_code, seen.signal, seen.pid) == (137, 9, pid)
        assert h.backend.running() == set()
        # Signalling an instance with no live attempt is a no-op.
        await h.backend.signal("srv", signal.SIGKILL)
        await h.backend.signal("never-launched", signal.SIGTERM)

    run(tmp_path, body)


def test_log_is_appended_across_attempts_with_a_marker(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.log("svc").parent.mkdir(parents=True)
        h.log("svc").write_text("written before srtr\n")
        await h.launch("svc", [PY, WORKLOAD, "--print", "first attempt"])
        await h.wait_exit("svc", 0)
        await h.launch("svc", [PY, WORKLOAD, "--print", "second attempt"], attempt=1, node=2)
        await h.wait_exit("svc", 1)
        text = h.log_text("svc")
        assert re.fullmatch(
            r"written before srtr\n"
            r"first attempt\n"
            r"==== srtr: svc attempt 1 starting on node2 at \d{4}-\d\d-\d\dT[0-9:.]+Z ====\n"
            r"second attempt\n",
            text,
        ), text

    run(tmp_path, body)


def test_env_is_spec_env_plus_srtr_vars_not_the_controllers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SRTR_TEST_SHOULD_NOT_LEAK", "secret")
    dump = "import json, os; print(json.dumps(dict(os.environ)))"

    async def body(h: Harness) -> None:
        await h.launch("envy", [PY, "-c", dump], node=2, env={"FOO": "bar", "SRTR_NODE": "x"})
        assert (await h.wait_exit("envy")).exit_code == 0
        env = json.loads(h.log_text("envy"))
        assert env["FOO"] == "bar"
        assert env["SRTR_NODE"] == "node2"
        assert env["SRTR_NODE_IP"] == "127.0.0.3"
        assert env["SRTR_INSTANCE"] == "envy"
        assert env["PATH"] == os.environ["PATH"]
        assert "SRTR_TEST_SHOULD_NOT_LEAK" not in env

    run(tmp_path, body)


def test_preamble_runs_first_and_argv_is_not_shell_split(tmp_path: Path) -> None:
    show = "import os, sys; print(repr(sys.argv[1:])); print(os.environ['FROM_PREAMBLE'])"

    async def body(h: Harness) -> None:
        await h.launch(
            "pre",
            [PY, "-c", show, "two words", "$HOME", "*", "a;b"],
            preamble="echo preamble ran\nexport FROM_PREAMBLE=yes",
        )
        assert (await h.wait_exit("pre")).exit_code == 0
        assert h.log_text("pre") == (
            "preamble ran\n" + repr(["two words", "$HOME", "*", "a;b"]) + "\nyes\n"
        )

    run(tmp_path, body)


def test_shell_mode_runs_one_command_line(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        await h.launch("bench", ["echo on $SRTR_NODE; exit 4"], shell=True, node=3)
        assert (await h.wait_exit("bench")).exit_code == 4
        assert h.log_text("bench") == "on node3\n"

    run(tmp_path, body)


def test_cwd_is_used(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        await h.launch("where", ["pwd"], cwd=tmp_path)
        await h.wait_exit("where")
        assert h.log_text("where") == f"{tmp_path}\n"

    run(tmp_path, body)


def test_term_stops_the_whole_group_including_a_grandchild(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"

    async def body(h: Harness) -> None:
        await h.launch("grp", ["bash", "-c", f"sleep 1000 & echo $! > {pidfile}; wait"])
        await wait_for(lambda: pidfile.exists() and pidfile.read_text().endswith("\n"))
        grandchild = int(pidfile.read_text())
        assert pid_alive(grandchild)
        await h.backend.signal("grp", signal.SIGTERM)
        seen = await h.wait_exit("grp")
        assert (seen.exit_code, seen.signal) == (143, 15)
        await wait_for(lambda: not pid_alive(grandchild), what="the grandchild to die")

    run(tmp_path, body)


def test_term_reaches_a_stopped_group_at_once(tmp_path: Path) -> None:
    """A SIGSTOPped instance gets SIGCONT after SIGTERM, so it ends now, not after its
    grace (a hung process a liveness probe stops, say)."""

    async def body(h: Harness) -> None:
        pid = await h.launch("frozen", [PY, WORKLOAD, "--print", "ready", "--run-for", "inf"])
        await h.wait_log("frozen", "ready")
        os.killpg(pid, signal.SIGSTOP)
        await wait_for(lambda: _state(pid) == "T", what="the group to stop")
        await h.backend.signal("frozen", signal.SIGTERM)
        seen = await h.wait_exit("frozen")
        assert (seen.exit_code, seen.signal) == (143, 15)

    run(tmp_path, body)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_term_can_be_ignored_and_kill_cannot(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        argv = [PY, WORKLOAD, "--ignore-term", "--print", "ready", "--run-for", "inf"]
        pid = await h.launch("stubborn", argv)
        await h.wait_log("stubborn", "ready")
        await h.backend.signal("stubborn", signal.SIGTERM)
        await h.wait_log("stubborn", "ignoring SIGTERM")
        assert h.exits("stubborn") == []
        assert h.backend.running() == {"stubborn"}
        assert pid_alive(pid)
        await h.backend.signal("stubborn", signal.SIGKILL)
        assert (await h.wait_exit("stubborn")).exit_code == 137

    run(tmp_path, body)


def test_leader_exit_kills_the_rest_of_its_group_and_close_kills_everything(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "orphan.pid"

    async def body(h: Harness) -> None:
        await h.launch("leaver", ["bash", "-c", f"sleep 1000 & echo $! > {pidfile}"])
        assert (await h.wait_exit("leaver")).exit_code == 0
        orphan = int(pidfile.read_text())
        runner = await h.launch("runner", [PY, WORKLOAD, "--print", "up", "--run-for", "inf"])
        await h.wait_log("runner", "up")
        assert h.backend.running() == {"runner"}
        # The instance ended with its main process, so what it left behind went with it.
        for _ in range(500):
            if not pid_alive(orphan):
                break
            await asyncio.sleep(0.01)
        assert not pid_alive(orphan)

        await h.backend.close()
        assert h.backend.running() == set()
        assert (await h.wait_exit("runner")).exit_code == 137
        assert not pid_alive(runner)
        await wait_for(lambda: not pid_alive(orphan), what="the orphaned grandchild to die")

        await h.backend.close()  # idempotent
        with pytest.raises(LaunchError, match="closed"):
            await h.launch("late", ["true"])

    run(tmp_path, body)


def test_missing_binary_raises_launch_error_and_logs_it(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        with pytest.raises(LaunchError) as info:
            await h.launch("ghost", ["srtr-no-such-binary-xyz", "--flag"])
        assert str(info.value) == (
            "cannot start 'srtr-no-such-binary-xyz': [Errno 2] No such file or directory"
        )
        assert str(info.value) in h.log_text("ghost")
        assert h.backend.running() == set()
        assert h.observations == []

    run(tmp_path, body)


def test_a_program_found_once_is_looked_for_again_when_it_moves_or_goes(tmp_path: Path) -> None:
    """Where a name was found on PATH is remembered (as a shell's `hash`), never trusted:
    a program moved to another PATH dir still starts, and a removed one is a LaunchError."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    tool = first / "srtr-moving-tool"
    tool.write_text("#!/bin/sh\necho ran from $0\n")
    tool.chmod(0o755)
    env = {"PATH": f"{first}:{second}:{os.environ['PATH']}"}

    async def body(h: Harness) -> None:
        await h.launch("tool", ["srtr-moving-tool"], env=env)
        assert (await h.wait_exit("tool")).exit_code == 0
        tool.rename(second / tool.name)
        await h.launch("tool", ["srtr-moving-tool"], env=env, attempt=1)
        assert (await h.wait_exit("tool", attempt=1)).exit_code == 0
        assert f"ran from {second / tool.name}" in h.log_text("tool")
        (second / tool.name).unlink()
        with pytest.raises(LaunchError) as info:
            await h.launch("tool", ["srtr-moving-tool"], env=env, attempt=2)
        assert str(info.value) == (
            "cannot start 'srtr-moving-tool': [Errno 2] No such file or directory"
        )

    run(tmp_path, body)


def test_bad_cwd_and_non_executable_raise_launch_error(tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")

    async def body(h: Harness) -> None:
        with pytest.raises(LaunchError, match=r"in '.*/nowhere': \[Errno 2\]"):
            await h.launch("lost", ["true"], cwd=tmp_path / "nowhere")
        with pytest.raises(LaunchError, match=r"Permission denied"):
            await h.launch("denied", [str(script)])
        with pytest.raises(LaunchError, match="empty argv"):
            await h.launch("empty", [])
        assert h.backend.running() == set()

    run(tmp_path, body)


def test_relaunch_while_the_previous_attempt_runs_is_refused(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        pid = await h.launch("once", [PY, WORKLOAD, "--run-for", "inf"])
        with pytest.raises(LaunchError, match=f"attempt 0 \\(pid {pid}\\) has not exited"):
            await h.launch("once", ["true"], attempt=1)
        assert h.backend.running() == {"once"}

    run(tmp_path, body)


def test_many_children_one_thread(tmp_path: Path) -> None:
    count = 200

    async def body(h: Harness) -> None:
        threads_before = threading.active_count()
        names = [f"w{i}" for i in range(count)]
        for name in names:
            await h.launch(name, ["sleep", "1000"])
        assert h.backend.running() == set(names)
        assert threading.active_count() <= threads_before + 2
        await asyncio.gather(*(h.backend.signal(name, signal.SIGTERM) for name in names))
        await wait_for(lambda: len(h.observations) == count, what=f"{count} exits")
        assert {o.name for o in h.observations} == set(names)
        assert {(o.exit_code, o.signal) for o in h.observations} == {(143, 15)}
        assert threading.active_count() <= threads_before + 2
        assert h.backend.running() == set()

    run(tmp_path, body)


def test_an_instance_outlives_a_killed_controller_and_can_be_adopted(tmp_path: Path) -> None:
    """No PDEATHSIG: a kill -9'd controller's instance lives on until adopted (or guarded)."""
    controller = f"""
import asyncio, json
from pathlib import Path
from srtr.backends.base import LaunchSpec
from srtr.backends.local.backend import LocalBackend

async def main():
    backend = LocalBackend(1)
    spec = LaunchSpec(name="child", node="node1", node_ip="127.0.0.2", argv=("sleep", "1000"),
                      env={{}}, log_path=Path({str(tmp_path / "child.log")!r}))
    await backend.launch(spec)
    print(json.dumps(backend.identity("child")), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": REPO}
    proc = subprocess.Popen([PY, "-c", controller], stdout=subprocess.PIPE, env=env)
    child = 0
    try:
        assert proc.stdout is not None
        identity = json.loads(proc.stdout.readline())
        child = identity["pid"]
        proc.kill()
        proc.wait()
        assert pid_alive(child)

        async def adopt() -> None:
            backend = LocalBackend(1)
            seen: list[Observation] = []
            backend.set_listener(seen.append)
            assert not await backend.adopt("child", 0, {**identity, "start": identity["start"] + 1})
            assert await backend.adopt("child", 0, identity)
            assert backend.running() == {"child"}
            await backend.signal("child", signal.SIGTERM)
            await wait_for(lambda: bool(seen), what="the adopted exit")
            assert seen[0].exit_code is None and seen[0].name == "child"
            await backend.close()

        asyncio.run(adopt())
        assert not pid_alive(child)
    finally:
        proc.kill()
        proc.wait()
        if child and pid_alive(child):
            os.kill(child, signal.SIGKILL)
        assert proc.stdout is not None
        proc.stdout.close()


def test_live_instances_leave_no_pidfd_in_the_fd_table_a_launch_copies(tmp_path: Path) -> None:
    """Their pidfds sit in the exit watcher's own table: every launch copies ours, and its
    exec closes each close-on-exec fd there one at a time (the cost grew with the job)."""

    def pidfds() -> int:
        count = 0
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[pidfd]"
        return count

    async def body(h: Harness) -> None:
        before = pidfds()
        for i in range(12):
            await h.launch(f"sleeper{i}", ["sleep", "1000"], node=1 + i % 3)
        assert h.backend.running() == {f"sleeper{i}" for i in range(12)}
        assert pidfds() == before
        await h.backend.signal("sleeper3", signal.SIGKILL)
        seen = await h.wait_exit("sleeper3")  # exits are still seen, through the watcher
        assert seen.signal == signal.SIGKILL

    run(tmp_path, body)
