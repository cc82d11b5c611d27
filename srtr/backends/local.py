"""The local backend: every instance attempt is a process group on this machine.

It owns the processes it starts and nothing else. `launch` starts one attempt in a new session,
so the attempt's process group id is its pid and `signal` reaches the whole group. Exits are seen
through one pidfd per live leader registered with the event loop, so there is no thread per
child: asyncio's default child watcher on Python 3.11 starts one per child, which does not scale
to thousands of instances (see "Facts measured on this machine" in the design notes).

Nodes are simulated: node K is `nodeK` with the loopback IP 127.0.0.1 + K, so services that
bind to `{node_ip}` do not collide. The CLI constructs this backend; controllers see it only as
a `srtr.backends.base.Backend`.

Costs worth knowing: one pidfd per live attempt (the controller's open-file limit bounds the
job).

A simulated node cannot fail by itself, so `lose_node` fails one on request (the control
socket's `lose-node` op): its attempts are killed and reported LOST, as the SLURM backend
reports the steps of a node that went DOWN, and nothing launches there again.

A controller that dies (kill -9) leaves its instances running on purpose, so that
`srtr up --adopt` can take them over with 0 restarts (`adopt`, by pid and kernel start
time). The job's guard process (`srtr.runtime.guard`) kills them if no controller adopts them within
the adoption window, so nothing outlives a crashed controller for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from srtr.backends.base import (
    LaunchError,
    LaunchSpec,
    Listener,
    NodeInfo,
    Observation,
    ObservationKind,
)
from srtr.reconciler.rundir import restart_marker

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT = 5.0
# Only these are taken from the controller's environment: anything else (tokens, SLURM_*,
# the user's experiments) must come from the recipe so that a run is reproducible.
_INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "PYTHONPATH")
# Below this many lingering groups, pruning is not worth a syscall per group.
_PRUNE_MIN = 64
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
_FIRST_IP = ipaddress.ip_address("127.0.0.1")


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


@dataclass(slots=True)
class _Attempt:
    """One started attempt whose leader has not been reaped yet."""

    name: str
    attempt: int
    node: str  # "" when unknown (an adopted attempt without SRTR_NODE)
    pid: int
    # Equal to pid (the child calls setsid), kept apart to make the killpg calls read right.
    pgid: int
    pidfd: int
    # Kept so that we can set its returncode after reaping: an unreaped-looking Popen that is
    # garbage collected goes to subprocess._active, whose waitpid(pid) could later reap an
    # unrelated child that reused the pid.
    popen: subprocess.Popen[bytes] | None  # None: adopted from an earlier controller
    loop: asyncio.AbstractEventLoop


class LocalBackend:
    """Runs instances as process groups on this machine, on simulated loopback nodes."""

    name = "local"

    def __init__(self, node_count: int, nodes: list[NodeInfo] | None = None) -> None:
        """Simulate `node_count` nodes, or use the real `nodes` (a subclass that runs remote).

        Args:
            node_count: how many simulated nodes (`node1`..`nodeN`, 127.0.0.2 upwards).
            nodes: the allocation's real nodes; replaces the simulated ones.

        Raises:
            ValueError: node_count is below 1 or does not fit in 127.0.0.0/8.
        """
        if nodes is not None:
            self._nodes = list(nodes)
        elif not 1 <= node_count <= _LOOPBACK.num_addresses - 3:
            raise ValueError(f"node_count must be between 1 and {_LOOPBACK.num_addresses - 3}")
        else:
            self._nodes = [
                NodeInfo(name=f"node{k}", ip=str(_FIRST_IP + k)) for k in range(1, node_count + 1)
            ]
        self._listener: Listener | None = None
        self._live: dict[str, _Attempt] = {}
        # Groups whose leader was reaped while other members (grandchildren) remained. Only
        # close() kills them; signal() targets the live attempt alone.
        self._lingering: set[int] = set()
        self._prune_at = _PRUNE_MIN
        self._lost_nodes: set[str] = set()
        self._lost_attempts: set[tuple[str, int]] = set()  # (name, attempt) killed with a node
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    def running(self) -> set[str]:
        return set(self._live)

    async def launch(self, spec: LaunchSpec) -> int:
        """Start one attempt as a new session with its output appended to `spec.log_path`.

        Returns:
            The pid of the attempt's leader, which is also its process group id.

        Raises:
            LaunchError: the backend is closed, the instance still has a live attempt, the log
                cannot be opened, or the process cannot be started (the message is also
                appended to the log when the log could be opened).
        """
        if self._closed:
            raise LaunchError(f"cannot start {spec.name!r}: the local backend is closed")
        if spec.node in self._lost_nodes:
            raise LaunchError(f"cannot start {spec.name!r}: node {spec.node} is lost")
        previous = self._live.get(spec.name)
        if previous is not None:
            raise LaunchError(
                f"cannot start {spec.name!r} attempt {spec.attempt}: attempt {previous.attempt}"
                f" (pid {previous.pid}) has not exited yet"
            )
        loop = asyncio.get_running_loop()
        fd = _open_log(spec.log_path)
        try:
            if spec.attempt > 0:
                marker = restart_marker(
                    instance=spec.name, attempt=spec.attempt, node=spec.node, at=datetime.now(UTC)
                )
                _append(fd, marker)
            try:
                popen = _start(spec, fd, self._command(spec), self._environment(spec))
                attempt = _watch(spec, popen, loop)
            except LaunchError as exc:
                _append(fd, f"==== srtr: {exc} ====\n")
                raise
        finally:
            os.close(fd)
        self._live[spec.name] = attempt
        self._idle.clear()
        loop.add_reader(attempt.pidfd, self._on_exit, attempt)
        return attempt.pid

    async def signal(self, name: str, signum: int) -> None:
        attempt = self._live.get(name)
        if attempt is None:
            return
        # The leader is not reaped yet, so its pid (the group id) cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(attempt.pgid, signum)

    def lose_node(self, node: str) -> list[str]:
        """Fail simulated `node`: SIGKILL every attempt on it, report each exit as LOST, and
        refuse launches there from now on. Returns the names of the instances it took.

        Raises:
            ValueError: the allocation has no node of that name.
        """
        if node not in {n.name for n in self._nodes}:
            raise ValueError(f"no node named {node!r}")
        self._lost_nodes.add(node)
        taken = [a for a in self._live.values() if a.node == node]
        for attempt in taken:
            self._lost_attempts.add((attempt.name, attempt.attempt))
            _kill_group(attempt.pgid)
        return sorted(a.name for a in taken)

    async def close(self) -> None:
        """SIGKILL every group we started, lingering ones too, and wait for the leaders' exits.

        Exits seen meanwhile are still reported to the listener. Leaders that are not reaped
        within a few seconds (stuck in the kernel) are abandoned with a warning.
        """
        self._closed = True
        for attempt in self._live.values():
            _kill_group(attempt.pgid)
        for pgid in self._lingering:
            _kill_group(pgid)
        self._lingering.clear()
        if not self._live:
            return
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await self._idle.wait()
        except TimeoutError:
            self._abandon()

    def identity(self, name: str) -> dict[str, int] | None:
        """pid and kernel start time of the live attempt: what adoption checks later."""
        attempt = self._live.get(name)
        if attempt is None:
            return None
        start = process_start_time(attempt.pid)
        return {"pid": attempt.pid, "start": start} if start is not None else None

    async def adopt(self, name: str, attempt: int, identity: dict[str, int]) -> bool:
        """Watch an attempt an earlier controller started, if it is still that process.

        The pid alone could have been reused; the kernel start time makes the match exact.
        The process is not our child, so its exit status cannot be read: its exit is
        reported with `exit_code=None`.
        """
        pid, start = identity.get("pid"), identity.get("start")
        if not pid or start is None or process_start_time(pid) != start:
            return False
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        loop = asyncio.get_running_loop()
        adopted = _Attempt(
            name=name,
            attempt=attempt,
            node=_environ(pid).get("SRTR_NODE", ""),
            pid=pid,
            pgid=os.getpgid(pid),
            pidfd=pidfd,
            popen=None,
            loop=loop,
        )
        self._live[name] = adopted
        self._idle.clear()
        loop.add_reader(pidfd, self._on_exit, adopted)
        return True

    def _on_exit(self, attempt: _Attempt) -> None:
        """Reader callback: the pidfd became readable, so the leader is a zombie; reap it."""
        attempt.loop.remove_reader(attempt.pidfd)
        os.close(attempt.pidfd)
        if attempt.popen is None:
            self._on_adopted_exit(attempt)
            return
        # An instance ends with its main process, as a container does: leftovers of the
        # group (a backgrounded child holding a port) would break the next attempt. The
        # unreaped leader keeps the group id from being reused, so this cannot hit a stranger.
        _kill_group(attempt.pgid)
        try:
            _, status = os.waitpid(attempt.pid, 0)
        except ChildProcessError:
            # Someone else in this process reaped it (a stray waitpid(-1)); the status is lost.
            exit_code, signum, message = 255, None, "exit status lost: reaped elsewhere"
        else:
            exit_code, signum, message = _describe(status)
        assert attempt.popen is not None
        attempt.popen.returncode = -signum if signum is not None else exit_code
        if self._live.get(attempt.name) is attempt:
            del self._live[attempt.name]
        self._note_lingering(attempt.pgid)
        if not self._live:
            self._idle.set()
        if self._listener is not None:
            self._listener(self._exit_observation(attempt, exit_code, signum, message))

    def _on_adopted_exit(self, attempt: _Attempt) -> None:
        # Not our child: init reaps it and keeps the status; the group may already be gone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(attempt.pgid, signal.SIGKILL)
        if self._live.get(attempt.name) is attempt:
            del self._live[attempt.name]
        if not self._live:
            self._idle.set()
        if self._listener is not None:
            self._listener(
                self._lost_observation(attempt)
                or Observation(
                    kind=ObservationKind.EXITED,
                    name=attempt.name,
                    attempt=attempt.attempt,
                    pid=attempt.pid,
                    exit_code=None,
                    message="exit status unknown: adopted from an earlier controller",
                )
            )

    def _lost_observation(self, attempt: _Attempt) -> Observation | None:
        """LOST for an attempt `lose_node` killed, else None."""
        if (attempt.name, attempt.attempt) not in self._lost_attempts:
            return None
        self._lost_attempts.discard((attempt.name, attempt.attempt))
        return Observation(
            kind=ObservationKind.LOST,
            name=attempt.name,
            attempt=attempt.attempt,
            pid=attempt.pid,
            message=f"node {attempt.node} was lost (simulated)",
        )

    def _exit_observation(
        self, attempt: _Attempt, exit_code: int, signum: int | None, message: str
    ) -> Observation:
        """What a reaped attempt means (the SLURM backend tells node failures apart here)."""
        lost = self._lost_observation(attempt)
        if lost is not None:
            return lost
        return Observation(
            kind=ObservationKind.EXITED,
            name=attempt.name,
            attempt=attempt.attempt,
            pid=attempt.pid,
            exit_code=exit_code,
            signal=signum,
            message=message,
        )

    def _command(self, spec: LaunchSpec) -> list[str]:
        """The argv that starts one attempt (the SLURM backend wraps it in srun)."""
        return _command(spec)

    def _environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The environment of the started process."""
        return _environment(spec)

    def _note_lingering(self, pgid: int) -> None:
        # Once a group is empty its number is a free pid that an unrelated process may reuse as
        # its own group id, so forget empty groups as soon as we notice them. The check right
        # after reaping is exact; the amortised prune keeps each exit O(1) on average. After
        # close() every group has been SIGKILLed already.
        if self._closed or not _group_exists(pgid):
            return
        self._lingering.add(pgid)
        if len(self._lingering) >= self._prune_at:
            self._lingering = {g for g in self._lingering if _group_exists(g)}
            self._prune_at = max(_PRUNE_MIN, 2 * len(self._lingering))

    def _abandon(self) -> None:
        stuck = list(self._live.values())
        log.warning(
            "local backend: %d process(es) not reaped %.0fs after SIGKILL, abandoning: %s",
            len(stuck),
            _CLOSE_TIMEOUT,
            ", ".join(f"{a.name} (pid {a.pid})" for a in stuck),
        )
        for attempt in stuck:
            attempt.loop.remove_reader(attempt.pidfd)
            os.close(attempt.pidfd)
        # Their Popen objects keep returncode None on purpose: subprocess then reaps them later.
        self._live.clear()
        self._idle.set()


def _open_log(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND and never O_TRUNC: one log spans every attempt, and writes by the child and
        # by us interleave without overwriting each other.
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LaunchError(f"cannot open log {path}: {exc.strerror}") from exc


def _append(fd: int, text: str) -> None:
    # Best effort: a full disk must not turn into a second, more confusing error.
    with contextlib.suppress(OSError):
        os.write(fd, text.encode())


def _command(spec: LaunchSpec) -> list[str]:
    if spec.shell:
        if len(spec.argv) != 1:
            raise LaunchError(
                f"cannot start {spec.name!r}: a shell launch takes exactly one command line,"
                f" got {len(spec.argv)} arguments"
            )
        script = spec.argv[0] if spec.preamble is None else f"{spec.preamble}\n{spec.argv[0]}"
        return ["bash", "-c", script]
    if not spec.argv:
        raise LaunchError(f"cannot start {spec.name!r}: empty argv")
    if spec.preamble is not None:
        # The argv travels as "$@", so it is never split or expanded by the shell.
        return ["bash", "-c", spec.preamble + '\nexec "$@"', "srtr-" + spec.name, *spec.argv]
    return list(spec.argv)


def _environment(spec: LaunchSpec) -> dict[str, str]:
    env = {key: os.environ[key] for key in _INHERITED_ENV if key in os.environ}
    env.update(spec.env)
    env["SRTR_NODE"] = spec.node
    env["SRTR_NODE_IP"] = spec.node_ip
    env["SRTR_INSTANCE"] = spec.name
    return env


def _start(
    spec: LaunchSpec, log_fd: int, argv: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            # The log fd itself, not a pipe: nothing of ours sits between the child and the
            # file, so no line is lost when the controller stops or falls behind.
            stdout=log_fd,
            stderr=log_fd,
            cwd=spec.cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        where = ""
        if spec.cwd is not None and exc.filename is not None:
            if os.fsdecode(exc.filename) == os.fsdecode(spec.cwd):
                where = f" in {os.fsdecode(spec.cwd)!r}"
        raise LaunchError(
            f"cannot start {argv[0]!r}{where}: [Errno {exc.errno}] {exc.strerror}"
        ) from exc
    except (subprocess.SubprocessError, ValueError) as exc:
        # ValueError: a NUL byte in argv, env or cwd. SubprocessError: the preexec hook failed.
        raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc


def _watch(
    spec: LaunchSpec, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop
) -> _Attempt:
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError as exc:
        # An attempt whose exit we could never observe must not be left running.
        _kill_group(popen.pid)
        popen.wait()
        raise LaunchError(f"cannot watch {spec.name!r} (pid {popen.pid}): {exc}") from exc
    return _Attempt(
        name=spec.name,
        attempt=spec.attempt,
        node=spec.node,
        pid=popen.pid,
        pgid=popen.pid,
        pidfd=pidfd,
        popen=popen,
        loop=loop,
    )


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _describe(status: int) -> tuple[int, int | None, str]:
    """A wait status → (exit code in the shell convention, signal number or None, message)."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            signame = signal.Signals(signum).name
        except ValueError:
            signame = f"signal {signum}"
        return 128 + signum, signum, f"killed by {signame}"
    code = os.WEXITSTATUS(status)
    return code, None, f"exited with code {code}"


def _kill_group(pgid: int) -> None:
    # EPERM means no member could be signalled (all became set-uid); nothing more we can do,
    # and close() must go on with the other groups.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
