"""`srtr up` on a terminal runs the TUI as a process of its own: its two halves.

The controller runs the job exactly as headless `srtr up` does, in the parent process. The
TUI is `srtr tui RUN_DIR` started by it on the same terminal, with a private flag: the
read end of a pipe. The TUI's work (reading state.json, building
frames, drawing) then never holds the controller's interpreter lock nor its event loop, and
it starts (imports, draws its screen) while the controller builds the job's store and
writes its first state.

Between the two:
- the parent writes the job's outcome on the pipe when the job ends (`tell`): its exit
  code, or `error` when it raised; the TUI's `job` future (`outcome`) resolves from it, as
  the in-process job task did. An end of file with no outcome (the parent died) fails it.
- intents go over the job's control channel, as from any `srtr tui`;
- the TUI's exit status says how it ended (`DETACHED`, `GONE`, else 0); a TUI that
  ends otherwise while the job runs (it crashed) has the job torn down;
- a lost terminal: the TUI leaves at once (`GONE`), and the parent tears down as on a
  hang-up (the kernel's SIGHUP usually told it first).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import srtr

DETACHED = 3  # the TUI's exit status after `d`: the job goes on headless
GONE = 4  # the TUI's exit status when its terminal went away
ERROR = b"error"
NICE = 10  # the TUI's niceness, added to srtr up's own


def start(run_dir: Path, theme: str | None) -> tuple[subprocess.Popen[bytes], int]:
    """Start the TUI of `srtr up` on this terminal; its process and the pipe's write end."""
    read, write = os.pipe()
    argv = [sys.executable, "-m", "srtr", "tui", str(run_dir)]
    argv += ["--up-fd", str(read)]
    if theme is not None:
        argv += ["--theme", theme]
    # The very srtr this process runs, wherever it was imported from.
    where = str(Path(srtr.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": where if not path else f"{where}{os.pathsep}{path}"}
    try:
        proc = subprocess.Popen(argv, pass_fds=(read,), env=env)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    return proc, write


async def exited(proc: subprocess.Popen[bytes]) -> int:
    """The TUI's exit status, waited for on the loop (a pidfd: no thread, no polling)."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    fd = os.pidfd_open(proc.pid)

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()


def hung_up(status: int) -> bool:
    """The TUI's status says that the terminal went away."""
    return status in (GONE, -signal.SIGHUP)


def hang_up() -> None:
    """Behave as on SIGHUP: the job's handler tears it down (exit 129). Not once the job has
    taken its handlers away (it is ending): the default action would kill this process."""
    handler = signal.getsignal(signal.SIGHUP)
    if handler not in (signal.SIG_DFL, signal.SIG_IGN, None):
        os.kill(os.getpid(), signal.SIGHUP)


def tell(write: int, job: asyncio.Future[int]) -> None:
    """The job's outcome to the TUI, then the pipe closed. A TUI already gone is fine."""
    failed = job.cancelled() or job.exception() is not None
    line = ERROR if failed else str(job.result()).encode()
    with contextlib.suppress(OSError):
        os.write(write, line + b"\n")
    with contextlib.suppress(OSError):
        os.close(write)


def outcome(read: int) -> asyncio.Future[int]:
    """The TUI's side: the job's outcome as the parent writes it on `read`."""
    loop = asyncio.get_running_loop()
    job: asyncio.Future[int] = loop.create_future()
    os.set_blocking(read, False)
    got = bytearray()

    def readable() -> None:
        try:
            data = os.read(read, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        got.extend(data)
        if data and b"\n" not in got:
            return
        loop.remove_reader(read)
        os.close(read)
        text = bytes(got).strip()
        if job.done():
            return
        if text.lstrip(b"-").isdigit():
            job.set_result(int(text))
        else:
            why = "the job raised" if text == ERROR else "srtr up ended without its job's end"
            job.set_exception(RuntimeError(why))

    loop.add_reader(read, readable)
    return job
