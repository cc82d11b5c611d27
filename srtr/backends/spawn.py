"""Starting one process of this machine, and what follows its end: no bookkeeping.

`spawn` starts a child in a new session with posix_spawn(3), `start_popen` with Popen
where a preexec hook or a working directory is needed; both put its output on a log fd.
`reap` waits for a leader and describes its status in the shell convention, `kill_group`
ends a group, `process_start_time` reads the kernel's start time that makes a pid exact.
`procgroup.ProcessGroups` composes these into its live set of attempts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from srtr.backends.base import LaunchError, LaunchSpec

_PR_SET_PDEATHSIG = 1


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


@dataclass(frozen=True)
class ExitStatus:
    """How a reaped leader ended: `code` in the shell convention (128+n for signal n)."""

    code: int
    signal: int | None
    message: str
    reason: str = ""  # OOMKilled: the kernel's OOM killer ended it (`cgroups.py`)


def parent_death_hook() -> Callable[[], None]:
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
    and any a library opened without the flag): `spawn`'s children then inherit none,
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


def open_log(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND and never O_TRUNC: one log spans every attempt, and writes by the child and
        # by us interleave without overwriting each other.
        # O_NOFOLLOW: a link planted at the log's name (to ~/.bashrc) is refused, not followed.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        return os.open(path, flags, 0o644)
    except OSError as exc:
        raise LaunchError(f"cannot open log {path}: {exc.strerror}") from exc


def append_note(fd: int, text: str) -> None:
    # Best effort: a full disk must not turn into a second, more confusing error.
    with contextlib.suppress(OSError):
        os.write(fd, text.encode())


# Popen restores these to SIG_DFL in its children (Python ignores SIGPIPE): so do we.
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


def spawn(spec: LaunchSpec, log_fd: int, argv: list[str], env: dict[str, str]) -> int:
    """Start `argv` in a new session with posix_spawn(3), its output on `log_fd`; the pid.

    The same child as `start_popen` makes without preexec hook and cwd, at half the cost from a
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


def start_popen(
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


def reap(pid: int) -> ExitStatus:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        # Someone else in this process reaped it (a stray waitpid(-1)); the status is lost.
        return ExitStatus(255, None, "exit status lost: reaped elsewhere")
    return _describe(status)


def environ_of(pid: int) -> dict[str, str]:
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


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
