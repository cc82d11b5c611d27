"""Process groups on this machine: start, watch, signal and reap them; no policy.

Both backends compose a `ProcessGroups`: the local backend's attempts are the instances
themselves, the SLURM backend's are the srun clients of its steps. The backend says which argv
and environment start an attempt, and what a reaped attempt means (EXITED, LOST): every exit
goes to the `on_exit` handler it was given, after the attempt has left the live set.

`start` runs one attempt in a new session, so the attempt's process group id is its pid and a
signal reaches the whole group. Exits are seen through one pidfd per live leader, all held
by one thread (`exit_watch`: in its own fd table, so that the table every launch copies
stays small), not a thread per child: asyncio's default child watcher on Python 3.11 starts
one per child, which does not scale to thousands of instances (see "Facts measured on this
machine" in the design notes). Costs worth knowing: one pidfd per live attempt (the
controller's open-file limit bounds the job).

An attempt an earlier controller started can be taken over (`adopt`) by pid and kernel start
time; it is not our child, so its exit status is unknown (`on_exit` gets None).

`instance_command` and `instance_environment` say how an instance runs as a process of this
machine: the local backend and the node agent (`backends/agent/node.py`) start them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from srtr.backends.base import Identity, LaunchError, LaunchSpec, Observation, ObservationKind
from srtr.backends.cgroups import MemoryCgroups
from srtr.backends.exit_watch import exit_watcher

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5.0
# Only these are taken from the starting process's environment by default: anything else
# (tokens, SLURM_*, the user's experiments) must come from the recipe so a run is reproducible.
INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "PYTHONPATH")


def inherited_environment() -> dict[str, str]:
    """The `INHERITED_ENV` variables this process has."""
    return {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}


_PR_SET_PDEATHSIG = 1
# Below this many lingering groups, pruning is not worth a syscall per group.
_PRUNE_MIN = 64


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)  # one read: the file is one short line
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


@dataclass(slots=True)
class Attempt:
    """One started attempt whose leader has not been reaped yet."""

    name: str
    attempt: int
    node: str  # "" when unknown (an adopted attempt without SRTR_NODE)
    pid: int
    # Equal to pid (the child calls setsid), kept apart to make the killpg calls read right.
    pgid: int
    # Our child (we reap it and know its status), or adopted from an earlier controller.
    child: bool
    # The Popen of a child started through subprocess, kept so that we can set its
    # returncode after reaping: an unreaped-looking Popen that is garbage collected goes to
    # subprocess._active, whose waitpid(pid) could later reap an unrelated child that reused
    # the pid. None for a posix_spawn'd child and an adopted attempt.
    popen: subprocess.Popen[bytes] | None
    loop: asyncio.AbstractEventLoop
    watch: int = 0  # its key in the exit watcher, once watched


@dataclass(frozen=True)
class ExitStatus:
    """How a reaped leader ended: `code` in the shell convention (128+n for signal n)."""

    code: int
    signal: int | None
    message: str
    reason: str = ""  # OOMKilled: the kernel's OOM killer ended it (`cgroups.py`)


# Told about every reaped attempt; the status is None for an adopted one (not our child).
ExitHandler = Callable[[Attempt, ExitStatus | None], None]
CommandBuilder = Callable[[LaunchSpec], list[str]]
EnvironmentBuilder = Callable[[LaunchSpec], dict[str, str]]


def exited(attempt: Attempt, status: ExitStatus | None) -> Observation:
    """The EXITED observation of a reaped attempt (exit code None when it was adopted)."""
    if status is None:
        return Observation(
            kind=ObservationKind.EXITED,
            name=attempt.name,
            attempt=attempt.attempt,
            pid=attempt.pid,
            exit_code=None,
            message="exit status unknown: adopted from an earlier controller",
        )
    return Observation(
        kind=ObservationKind.EXITED,
        name=attempt.name,
        attempt=attempt.attempt,
        pid=attempt.pid,
        exit_code=status.code,
        signal=status.signal,
        message=status.message,
        reason=status.reason,
    )


class ProcessGroups:
    """At most one live attempt per instance name, each a process group of its own."""

    def __init__(
        self,
        on_exit: ExitHandler,
        *,
        command: CommandBuilder,
        environment: EnvironmentBuilder,
        owner: str,
        die_with_parent: bool = False,
        memory_cgroups: bool = True,
    ) -> None:
        """
        Args:
            on_exit: told about every reaped attempt (see ExitHandler).
            command: the argv that starts an attempt; may raise LaunchError.
            environment: the environment of the started process.
            owner: the backend's name, for messages.
            die_with_parent: each leader gets SIGKILL when this process dies (Linux's
                parent-death signal), so a node agent killed by `kill -9` takes its
                instances' leaders with it. Members a leader forked are not covered.
            memory_cgroups: attempts with a memory limit run in a memory cgroup of their
                own, and OOM kills are told apart (`cgroups.py`); False where the attempts
                are not the instances (the SLURM backend's srun clients).
        """
        self._on_exit = on_exit
        self._command = command
        self._environment = environment
        self._owner = owner
        self._preexec = _parent_death_hook() if die_with_parent else None
        if self._preexec is None:
            close_inherited_on_exec()  # `_spawn` has no close_fds
        self._cgroups = MemoryCgroups(enabled=memory_cgroups)
        self._watcher = exit_watcher()  # started here, not in a launch inside a node's view
        self._live: dict[str, Attempt] = {}
        # Groups whose leader was reaped while other members (grandchildren) remained. Only
        # close() kills them; signal() targets the live attempt alone.
        self._lingering: set[int] = set()
        self._prune_at = _PRUNE_MIN
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __contains__(self, name: str) -> bool:
        return name in self._live

    def get(self, name: str) -> Attempt | None:
        return self._live.get(name)

    def names(self) -> set[str]:
        return set(self._live)

    def attempts(self) -> list[Attempt]:
        return list(self._live.values())

    def start(self, spec: LaunchSpec) -> Attempt:
        """Start one attempt as a new session with its output appended to `spec.log_path`.

        Must be called on the event loop, which then watches the attempt's exit.

        Raises:
            LaunchError: closed, the instance still has a live attempt, the log cannot be
                opened, or the process cannot be started (the message is also appended to
                the log when the log could be opened).
        """
        if self._closed:
            raise LaunchError(f"cannot start {spec.name!r}: the {self._owner} backend is closed")
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
                # Here, not at the top: rundir (and the status model) weighs on every node
                # agent's start, and only a restart writes a marker.
                from srtr.reconciler.rundir import restart_marker

                marker = restart_marker(
                    instance=spec.name, attempt=spec.attempt, node=spec.node, at=datetime.now(UTC)
                )
                _append(fd, marker)
            try:
                argv = self._cgroups.argv(spec, self._command(spec))
                env = self._environment(spec)
                if self._preexec is None and spec.cwd is None:
                    attempt = _attempt(spec, _spawn(spec, fd, argv, env), None, loop)
                else:
                    popen = _start(spec, fd, argv, env, self._preexec)
                    attempt = _attempt(spec, popen.pid, popen, loop)
                self._register_child(attempt)
            except LaunchError as exc:
                _append(fd, f"==== srtr: {exc} ====\n")
                raise
        finally:
            os.close(fd)
        return attempt

    def signal(self, name: str, signum: int) -> None:
        """Send `signum` to the group of the live attempt of `name`; no-op if there is none."""
        attempt = self._live.get(name)
        if attempt is None:
            return
        self._cgroups.signalled(name, signum)
        # The leader is not reaped yet, so its pid (the group id) cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(attempt.pgid, signum)

    def identity(self, name: str) -> Identity | None:
        """pid and kernel start time of the live attempt: what adoption checks later."""
        attempt = self._live.get(name)
        if attempt is None:
            return None
        start = process_start_time(attempt.pid)
        return {"pid": attempt.pid, "start": start} if start is not None else None

    def adopt(self, name: str, attempt: int, identity: Identity) -> bool:
        """Watch an attempt an earlier controller started, if it is still that process.

        The pid alone could have been reused; the kernel start time makes the match exact.
        Must be called on the event loop.
        """
        pid, start = identity.get("pid"), identity.get("start")
        if not pid or start is None or process_start_time(pid) != start:
            return False
        try:
            adopted = Attempt(
                name=name,
                attempt=attempt,
                node=_environ(pid).get("SRTR_NODE", ""),
                pid=pid,
                pgid=os.getpgid(pid),
                child=False,
                popen=None,
                loop=asyncio.get_running_loop(),
            )
            self._register(adopted)
        except OSError:  # gone meanwhile
            return False
        return True

    async def wait_idle(self, within: float) -> bool:
        """Wait up to `within` seconds for every live attempt to exit; True when none is left."""
        try:
            async with asyncio.timeout(within):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """SIGKILL every group we started, lingering ones too, and wait for the leaders' exits.

        Exits seen meanwhile are still reported to `on_exit`. Leaders that are not reaped
        within a few seconds (stuck in the kernel) are abandoned with a warning.
        """
        self._closed = True
        for attempt in self._live.values():
            kill_group(attempt.pgid)
        for pgid in self._lingering:
            kill_group(pgid)
        self._lingering.clear()
        if self._live:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._idle.wait()
            except TimeoutError:
                self._abandon()
        self._cgroups.close()

    def _register_child(self, attempt: Attempt) -> None:
        """`_register` a child just started; one whose exit cannot be watched is killed."""
        try:
            self._register(attempt)
        except OSError as exc:
            # An attempt whose exit we could never observe must not be left running.
            kill_group(attempt.pid)
            if attempt.popen is not None:
                attempt.popen.wait()
            else:
                _reap(attempt.pid)
            raise LaunchError(f"cannot watch {attempt.name!r} (pid {attempt.pid}): {exc}") from exc

    def _register(self, attempt: Attempt) -> None:
        """Watch the attempt's exit; OSError if its pidfd cannot be opened."""
        attempt.watch = self._watcher.watch(
            attempt.pid, attempt.loop, functools.partial(self._on_exited, attempt)
        )
        self._live[attempt.name] = attempt
        self._idle.clear()

    def _on_exited(self, attempt: Attempt) -> None:
        """The watcher saw the leader exit: it is a zombie (or gone, if not ours); reap it."""
        if not attempt.child:
            # Not our child: init reaps it and keeps the status; the group may be gone.
            kill_group(attempt.pgid)
            self._forget(attempt)
            self._on_exit(attempt, None)
            return
        # An instance ends with its main process, as a container does: leftovers of the
        # group (a backgrounded child holding a port) would break the next attempt. The
        # unreaped leader keeps the group id from being reused, so this cannot hit a stranger.
        kill_group(attempt.pgid)
        status = _reap(attempt.pid)
        oom = self._cgroups.reason(attempt.name, status, attempt.pid)
        status = dataclasses.replace(status, reason=oom) if oom else status
        if attempt.popen is not None:
            attempt.popen.returncode = -status.signal if status.signal is not None else status.code
        if self._live.get(attempt.name) is attempt:
            del self._live[attempt.name]
        self._note_lingering(attempt.pgid)
        if not self._live:
            self._idle.set()
        self._on_exit(attempt, status)

    def _forget(self, attempt: Attempt) -> None:
        if self._live.get(attempt.name) is attempt:
            del self._live[attempt.name]
        if not self._live:
            self._idle.set()

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
            "%s backend: %d process(es) not reaped %.0fs after SIGKILL, abandoning: %s",
            self._owner,
            len(stuck),
            CLOSE_TIMEOUT,
            ", ".join(f"{a.name} (pid {a.pid})" for a in stuck),
        )
        for attempt in stuck:
            self._watcher.unwatch(attempt.watch)
        # Their Popen objects keep returncode None on purpose: subprocess then reaps them later
        # (a posix_spawn'd one stays a zombie until we exit: it did not die of SIGKILL anyway).
        self._live.clear()
        self._idle.set()


def instance_command(spec: LaunchSpec) -> list[str]:
    """The argv that runs an instance attempt as a process here (see LaunchSpec).

    Raises:
        LaunchError: an empty argv, or a shell launch that is not one command line.
    """
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


def instance_environment(spec: LaunchSpec, inherited: Mapping[str, str]) -> dict[str, str]:
    """An instance attempt's environment: `inherited`, the spec's env, then srtr's own
    SRTR_NODE, SRTR_NODE_IP and SRTR_INSTANCE."""
    env = dict(inherited)
    env.update(spec.env)
    env["SRTR_NODE"] = spec.node
    env["SRTR_NODE_IP"] = spec.node_ip
    env["SRTR_INSTANCE"] = spec.name
    return env


def _parent_death_hook() -> Callable[[], None]:
    """A preexec hook that asks for SIGKILL when the starting process dies.

    libc's prctl is looked up here, before any fork; the child only calls it. A child whose
    parent died before the call (no signal would ever come) exits at once.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return hook


def close_inherited_on_exec() -> None:
    """Mark close-on-exec every fd above 2 this process holds (what its parent left open,
    and any a library opened without the flag): `_spawn`'s children then inherit none,
    as Popen's close_fds ensures for its own. The fds we open later carry the flag already
    (Python's default, PEP 446; see node_tmp's received fds for the one exception)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            # EBADF: listdir's own fd, closed by now.
            with contextlib.suppress(OSError):
                os.set_inheritable(int(name), False)


def kill_group(pgid: int) -> None:
    """SIGKILL process group `pgid`; a group that is gone or out of reach is no error."""
    # EPERM means no member could be signalled (all became set-uid); nothing more we can do,
    # and close() must go on with the other groups.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


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


# Popen restores these to SIG_DFL in its children (Python ignores SIGPIPE): so do we.
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


def _spawn(spec: LaunchSpec, log_fd: int, argv: list[str], env: dict[str, str]) -> int:
    """Start `argv` in a new session with posix_spawn(3), its output on `log_fd`; the pid.

    The same child as `_start` makes without preexec hook and cwd, at half the cost from a
    large controller (glibc's clone(CLONE_VM|CLONE_VFORK) and no error pipe; measured from a
    90 MB process: 0.6-0.7 ms per launch against Popen's 1.4 ms), which is most of the time a
    job of thousands of instances takes to start. Every fd of ours is close-on-exec (PEP 446)
    and so does not reach the child, as Popen's close_fds ensures.
    """
    path = env.get("PATH", os.defpath)
    try:
        return _posix_spawn(_program(argv[0], path), argv, env, log_fd)
    except FileNotFoundError as exc:
        if "/" in argv[0] or (argv[0], path) not in _FOUND:
            raise LaunchError(f"cannot start {argv[0]!r}: [Errno 2] {exc.strerror}") from exc
        del _FOUND[argv[0], path]  # moved or removed since: look again, once
        try:
            return _posix_spawn(_program(argv[0], path), argv, env, log_fd)
        except FileNotFoundError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: [Errno 2] {exc.strerror}") from exc
    except OSError as exc:
        raise LaunchError(f"cannot start {argv[0]!r}: [Errno {exc.errno}] {exc.strerror}") from exc
    except ValueError as exc:  # a NUL byte in argv or env
        raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc


# Where a program name was found on a PATH, as a shell's `hash` remembers it: the PATH walk
# (an access(2) per directory) is left out of all but the first of a job's launches.
_FOUND: dict[tuple[str, str], str] = {}


def _program(name: str, path: str) -> str:
    """`name` as posix_spawn needs it: a path (Popen searches `env`'s PATH, so do we).

    Raises:
        FileNotFoundError: no executable of that name on `path`.
    """
    if "/" in name:
        return name
    found = _FOUND.get((name, path))
    if found is None:
        found = shutil.which(name, path=path)
        if found is None:
            raise FileNotFoundError(2, "No such file or directory", name)
        _FOUND[name, path] = found
    return found


def _posix_spawn(program: str, argv: list[str], env: dict[str, str], log_fd: int) -> int:
    return os.posix_spawn(
        program,
        argv,
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ],
        setsid=True,
        setsigmask=(),
        setsigdef=_DEFAULT_SIGNALS,
    )


def _start(
    spec: LaunchSpec,
    log_fd: int,
    argv: list[str],
    env: dict[str, str],
    preexec: Callable[[], None] | None,
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
            preexec_fn=preexec,
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


def _attempt(
    spec: LaunchSpec,
    pid: int,
    popen: subprocess.Popen[bytes] | None,
    loop: asyncio.AbstractEventLoop,
) -> Attempt:
    return Attempt(
        name=spec.name,
        attempt=spec.attempt,
        node=spec.node,
        pid=pid,
        pgid=pid,
        child=True,
        popen=popen,
        loop=loop,
    )


def _reap(pid: int) -> ExitStatus:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        # Someone else in this process reaped it (a stray waitpid(-1)); the status is lost.
        return ExitStatus(255, None, "exit status lost: reaped elsewhere")
    return _describe(status)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _describe(status: int) -> ExitStatus:
    """A wait status → the exit code in the shell convention, the signal number, a message."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            signame = signal.Signals(signum).name
        except ValueError:
            signame = f"signal {signum}"
        return ExitStatus(128 + signum, signum, f"killed by {signame}")
    code = os.WEXITSTATUS(status)
    return ExitStatus(code, None, f"exited with code {code}")


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
