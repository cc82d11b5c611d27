"""The run dir and its append-only files, kept whatever the disk does.

`RunDir` recreates a run dir that vanished while the job runs (`rm -rf`): the directory
(0700) and logs/, with a warning event, and tells the other side tasks so they write their
files again (the control socket listens again, state.json and the recipe copies are
rewritten). `EventFile` (events.jsonl) keeps events it cannot write in memory and retries
every `RETRY_PERIOD` while any wait; `LogFile` (logs/srtr.log) drops lines it cannot write.
Both report a fault once, through the store's `write_faults`, and never raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from srtr.controllers.context import Ctx
from srtr.runtime import run_dir_owner
from srtr.store.persist import AppendFile, EventLog
from srtr.store.store import Event
from srtr.store.write_faults import WriteFaults

RETRY_PERIOD = 1.0  # how often a failing write is tried again
CHECK_PERIOD = 2.0  # how often the run dir is looked for (one stat)


def stderr_note(text: str) -> None:
    """A line on stderr, unbuffered and best effort: stderr may be on the failing disk."""
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode("utf-8", "replace"))


class RunDir:
    """The run dir itself: recreated (0700, with logs/) when it vanishes under the job."""

    name = "run dir"

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.on_recreated: list[Callable[[], None]] = []
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        self.ctx.store.write_faults.set_restore(self.restore)
        self._timer = asyncio.get_running_loop().call_later(CHECK_PERIOD, self._check)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.ctx.store.write_faults.set_restore(None)

    def _check(self) -> None:
        """A quiet job writes nothing for a while: look for the run dir every few seconds."""
        run_dir = self.ctx.run_dir
        if not (run_dir / "logs").is_dir():
            self.restore()
        if not (run_dir / "state.json").exists():
            self.ctx.store.changed()  # state.json is written again (or retried)
        self._timer = asyncio.get_running_loop().call_later(CHECK_PERIOD, self._check)

    def restore(self) -> bool:
        """Recreate the run dir and logs/ if they vanished; True when they exist now."""
        run_dir = self.ctx.run_dir
        logs = run_dir / "logs"
        if logs.is_dir():
            return True
        if self._busy:
            return False  # reporting the recreation writes an event, which comes back here
        self._busy = True
        try:
            return self._recreate()
        finally:
            self._busy = False

    def _recreate(self) -> bool:
        run_dir, faults = self.ctx.run_dir, self.ctx.store.write_faults
        vanished = not run_dir.is_dir()
        try:
            # It holds env values (recipe.yaml, state.json): only its owner may read it; made
            # only where nothing holds its path now, never into another user's dir or link.
            if vanished:
                run_dir_owner.recreate(run_dir)
            (run_dir / "logs").mkdir(exist_ok=True)
        except OSError as exc:
            faults.failed("run dir", exc, "srtr goes on from memory and tries again")
            return False
        faults.ok("run dir")
        what = f"the run dir {run_dir}" if vanished else f"{run_dir / 'logs'}"
        self.ctx.store.record(
            "job",
            "RunDirRecreated",
            f"{what} vanished while the job ran; recreated it: what it held is gone, what "
            "happens from now on is written again",
            warning=True,
        )
        if vanished:
            for rewrite in self.on_recreated:
                rewrite()
        return True


class FaultReportingHandler(logging.Handler):
    """A log file whose failed writes are write faults (reported once), never tracebacks.

    Python's FileHandler prints a traceback to stderr for every record it cannot write; this
    one drops the record, reports the fault, and reports again once a record gets through.
    """

    def __init__(self, target: str, file: AppendFile, faults: WriteFaults) -> None:
        super().__init__()
        self.target = target
        self.file = file
        self.faults = faults
        self.loop: asyncio.AbstractEventLoop | None = None
        self._owner = threading.get_ident()
        self._lines: list[bytes] = []  # logged in this turn of the loop, not yet written

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
        except Exception:  # a bad format string: logging's own report
            self.handleError(record)
            return
        self.take(data)

    def line(self, text: str) -> None:
        """Log `text`, already formatted, as one line."""
        self.take((text + "\n").encode("utf-8", "replace"))

    def take(self, data: bytes) -> None:
        loop = self.loop
        if loop is not None and threading.get_ident() == self._owner and not loop.is_closed():
            # The loop's lines go out together at the end of its turn: a teardown logs
            # 160,000 events, and each line's own write was three system calls.
            if not self._lines:
                loop.call_soon(self.flush)
            self._lines.append(data)
            return
        self._write(data)

    def flush(self) -> None:
        """Write the lines the loop's turn logged so far."""
        if self._lines:
            data, self._lines = b"".join(self._lines), []
            self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            self.file.write(data)
        except OSError as exc:
            self._report(self.faults.failed, exc, "its lines are dropped while it fails")
        else:
            if self.target in self.faults.failing:
                self._report(self.faults.ok)

    def _report(self, how: Callable[..., None], *args: Any) -> None:
        """The store belongs to the loop's thread; a record from another thread goes there."""
        if threading.get_ident() == self._owner:
            how(self.target, *args)
        elif self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self.loop.call_soon_threadsafe(how, self.target, *args)

    def close(self) -> None:
        self.flush()
        self.file.close()
        super().close()


class LogFile:
    """logs/srtr.log: every event, and what the controllers log."""

    name = "srtr.log"
    TARGET = "logs/srtr.log"

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.logger = logging.getLogger("srtr")
        faults = ctx.store.write_faults
        file = AppendFile(ctx.run_dir / "logs" / "srtr.log", faults.restore_run_dir)
        self.handler = FaultReportingHandler(self.TARGET, file, faults)
        self._stopped = False

    async def start(self) -> None:
        self.handler.loop = asyncio.get_running_loop()
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        self.ctx.store.subscribe_events(self._on_event)

    def _on_event(self, e: Event) -> None:
        """The line `logger.info("%s %s %s: %s", ...)` wrote, without logging's machinery
        (a record, its filters and handlers): a teardown logs 160,000 events."""
        if not self._stopped:
            text = f"{_asctime(time.time())} INFO {e.type} {e.reason} {e.object}: {e.message}"
            self.handler.line(text)

    async def stop(self) -> None:
        self._stopped = True
        self.logger.removeHandler(self.handler)
        self.handler.close()


_STAMP: list[tuple[int, str]] = [(-1, "")]  # the last second formatted, and its text


def _asctime(now: float) -> str:
    """`logging.Formatter`'s default `%(asctime)s` of a record made at `now`."""
    second = int(now)
    if _STAMP[0][0] != second:
        _STAMP[0] = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)))
    return f"{_STAMP[0][1]},{int((now - second) * 1000):03d}"


class EventFile:
    """events.jsonl, appended as events happen; what cannot be written waits in memory."""

    name = "events.jsonl"

    def __init__(self, ctx: Ctx, note: Callable[[str], None] = stderr_note) -> None:
        self.ctx = ctx
        self.note = note
        self.log = EventLog(ctx.run_dir / "events.jsonl", ctx.store.write_faults)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._soon = False  # a write is due at the end of this loop turn

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.ctx.store.subscribe_events(self._on_event)

    def _on_event(self, event: Event) -> None:
        if self._loop is None:
            self.log(event)
            return
        # Written at the end of this loop turn, with the turn's other events: one write.
        self.log.add(event)
        if not self._soon:
            self._soon = True
            self._loop.call_soon(self._write_soon)

    def _write_soon(self) -> None:
        self._soon = False
        self.log.flush()
        self._arm()

    def _arm(self) -> None:
        if self.log.pending and self._retry is None and self._loop is not None:
            self._retry = self._loop.call_later(RETRY_PERIOD, self._flush)

    def _flush(self) -> None:
        self._retry = None
        self.log.flush()
        self._arm()

    async def stop(self) -> None:
        self._loop = None  # no more retries
        if self._retry is not None:
            self._retry.cancel()
        if not self.log.flush():
            fault = self.ctx.store.write_faults.failing.get(EventLog.TARGET)
            why = f": {fault.error}" if fault else ""
            self.note(
                f"srtr: {len(self.log.pending) + self.log.dropped} event(s) could not be "
                f"written to {self.log.file.path}{why}"
            )
        self.log.close()
