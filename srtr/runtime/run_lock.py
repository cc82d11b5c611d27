"""Never two controllers of one run dir: the controller's lock, `controller.lock`.

A controller takes an exclusive `flock` on `RUN_DIR/controller.lock` before it starts
anything and holds it for its whole life (the kernel drops it when the process dies, however
it dies). `srtr up --adopt` and `srtr up --run-dir` of a live job ask `holder` first and
refuse with one line while it is held, whatever the heartbeat says: a controller that cannot
write its heartbeat (a full disk, a flood of connections) is slow or mute, not gone, and a
second controller would relaunch what the first one still runs.

The file is opened without following a symbolic link, made 0600, and must be the user's:
someone else's file by that name is refused rather than locked (a lock they hold would keep
the owner out, and one they planted is theirs to read).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from srtr.resources.errors import Problem, RecipeError

LOCK_FILE = "controller.lock"

_held: dict[Path, int] = {}  # run dir -> the descriptor whose lock this process holds


class LockHeld(RecipeError):
    """Another controller holds the run dir's lock (one line, exit 2 like a bad input)."""

    def __init__(self, run_dir: Path, who: str) -> None:
        super().__init__(
            str(run_dir), [Problem((), f"another controller runs this job ({who}); not adopting")]
        )


def _open(run_dir: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(run_dir / LOCK_FILE, flags, 0o600)
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RecipeError(
            str(run_dir / LOCK_FILE),
            [Problem((), f"not a file of yours (owner uid {info.st_uid}); refusing to use it")],
        )
    return fd


def _who(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 64, 0).decode("ascii", "replace").split()
        if text and text[0].isdigit():
            return f"pid {int(text[0])} holds {LOCK_FILE}"
    return f"a process holds {LOCK_FILE}"


def holder(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s controller lock ("pid N holds ..."), or None when nobody does
    (or there is no such file, or it cannot be opened: no controller of ours runs there)."""
    if run_dir.resolve() in _held:
        return f"pid {os.getpid()} holds {LOCK_FILE}"
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return _who(fd)
        return None
    finally:
        os.close(fd)  # a shared lock we took goes with it
    return None


def hold(run_dir: Path) -> None:
    """Take `run_dir`'s controller lock for the life of this process; `LockHeld` when
    another process has it."""
    key = run_dir.resolve()
    if key in _held:
        return
    fd = _open(run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        who = _who(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise LockHeld(run_dir, who) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd


def release(run_dir: Path) -> None:
    """Let go of the lock (the job ended); a later `srtr up --reuse-run-dir` may take it."""
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def one_line(where: Path) -> Iterator[None]:
    """`srtr up --adopt`: whatever it meets in a run dir it did not write (a state.json of
    another version, a truncated file, another user's) is one line and exit 2, never a
    traceback. Refusals (RecipeError) and signals pass through as they are."""
    try:
        yield
    except RecipeError:
        raise
    except Exception as exc:  # everything else, reported in one line
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        why = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        raise RecipeError(str(where), [Problem((), f"cannot adopt this job: {why}")]) from None


def answering(run_dir: Path, timeout: float = 3.0) -> bool:
    """Whether a controller of `run_dir` answers on its control channel: across hosts a
    flock may not be seen (a file system without shared locks), and a heartbeat may be stale
    while its controller lives, so `--adopt` asks before it concludes "gone". Any answer
    counts, a refusal of the unknown op `ping` included."""
    from srtr.runtime import control

    try:
        control.send(run_dir, "ping", timeout=timeout)
    except control.Unreachable:
        return False
    except control.ControlError:
        return True  # it answered (that it knows no "ping")
    return True
