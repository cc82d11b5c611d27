"""`srtr up` on a terminal runs the TUI as a process of its own: its two halves.

The controller runs the job exactly as headless `srtr up` does, in the parent process. The
TUI is `srtr tui RUN_DIR` started by it on the same terminal, with a private flag: the
read end of a pipe. The TUI's work (reading state.json, building
frames, drawing) then never holds the controller's interpreter lock nor its event loop, and
it starts (imports, draws its screen) while the controller builds the job's store and
writes its first state.

Between the two:
- the TUI starts while the controller plans the job (`UpTui`), and the parent hands it the
  plan (`planned.py`) in a file of its own (a memfd the TUI inherited) and a line on the
  pipe, `plan FD`: the TUI shows the planned instances, Pending, until the first
  state.json (a second or two later on 80,000 instances);
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
import site
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import srtr
from srtr.tui import planned

if TYPE_CHECKING:
    from srtr.resources.objects import DesiredState

DETACHED = 3  # the TUI's exit status after `d`: the job goes on headless
GONE = 4  # the TUI's exit status when its terminal went away
ERROR = b"error"
PLAN = b"plan "  # a line `plan FD`: the plan is in the TUI's descriptor FD
NICE = 10  # the TUI's niceness, added to srtr up's own


class UpTui:
    """The parent's handle on the TUI of `srtr up` (a `runtime.request.PlanWatcher`).

    It starts when the controller starts planning (`planning`), so that its start-up
    (Python, Textual: half a second of a core) runs beside the plan on this host's other
    core, or else before the job runs (`start`). `planned` hands it the plan, the first
    frame it shows: the planned instances, Pending, until the first state.json, which
    comes seconds later on a large job (the store built, the first write).
    """

    def __init__(self, run_dir: Path, theme: str | None) -> None:
        self.run_dir, self.theme = run_dir, theme
        self.proc: subprocess.Popen[bytes] | None = None
        self.write = -1  # the pipe's write end, once started
        self._plan = -1  # the plan's file (a memfd, the TUI has its own descriptor of it)

    def planning(self) -> None:
        self.start()

    def planned(self, desired: DesiredState, backend: str, slurm_job_id: str | None) -> None:
        """The plan to the TUI: written to the plan's file, then a line on the pipe. A TUI
        that is gone, or a plan that cannot be written, only costs the early frame."""
        if self.proc is None or self._plan < 0:
            return
        data = planned.encode(desired, backend=backend, slurm_job_id=slurm_job_id)
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(self._plan, view) :]
            os.write(self.write, PLAN + str(self._plan).encode() + b"\n")
        os.close(self._plan)
        self._plan = -1

    def start(self) -> None:
        """Start the TUI on this terminal (once)."""
        if self.proc is None:
            self.proc, self.write, self._plan = _start(self.run_dir, self.theme)

    def abandon(self, timeout: float = 10.0) -> None:
        """The job could not be made (bad input, a signal): the TUI leaves the terminal as
        it found it, and is gone, before the caller says why on it."""
        if self.proc is None:
            return
        if self._plan >= 0:
            os.close(self._plan)
            self._plan = -1
        with contextlib.suppress(OSError):
            os.write(self.write, ERROR + b"\n")
        with contextlib.suppress(OSError):
            os.close(self.write)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _start(run_dir: Path, theme: str | None) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start the TUI of `srtr up` on this terminal; its process, the pipe's write end and
    the plan's file (which the TUI holds as well, at the same number)."""
    read, write = os.pipe()
    plan = os.memfd_create("srtr-plan", os.MFD_CLOEXEC)
    argv = [sys.executable, "-m", "srtr", "tui", str(run_dir)]
    argv += ["--up-fd", str(read)]
    if theme is not None:
        argv += ["--theme", theme]
    try:
        proc = subprocess.Popen(argv, pass_fds=(read, plan), env=child_env(os.environ))
    except BaseException:
        os.close(write)
        os.close(plan)
        raise
    finally:
        os.close(read)
    return proc, write, plan


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for the TUI's process, which must import the very srtr this process runs:
    srtr's parent directory first on PYTHONPATH, unless the child finds it there anyway
    (a site directory: a wheel's site-packages, which must not shadow what PYTHONPATH
    names), or PYTHONPATH has it already."""
    where = str(Path(srtr.__file__).resolve().parent.parent)
    path = env.get("PYTHONPATH", "")
    sites = {str(Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages())}
    if where in sites or where in path.split(os.pathsep):
        return dict(env)
    return {**env, "PYTHONPATH": where if not path else f"{where}{os.pathsep}{path}"}


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


def outcome(read: int, plan: asyncio.Future[int] | None = None) -> asyncio.Future[int]:
    """The TUI's side: the job's outcome as the parent writes it on `read`; `plan` gets
    the descriptor of the plan's file, if the parent hands one over first."""
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
        while got.startswith(PLAN) and b"\n" in got:
            line, _, rest = bytes(got).partition(b"\n")
            got[:] = rest
            if plan is not None and not plan.done() and line[len(PLAN) :].isdigit():
                plan.set_result(int(line[len(PLAN) :]))
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
