"""Plain progress lines for `srtr up --headless`: one line per event, warnings in colour.

Lines are written by a thread of their own through a bounded queue, so a terminal or pipe
that stops reading (`srtr up | less`, a full pipe nobody drains) can never stall the
controller: when the queue is full, lines are counted and dropped, and a note says how many.
events.jsonl always has every event.

A terminal that hangs up (EIO) or a pipe whose reader left (EPIPE), any failed write to
a stdout that is not a file, is reported once through `on_lost`, with the errno; `srtr up`
treats a closed pipe (`srtr up | head`) as SIGPIPE and anything else as a hang-up. Lines are
then dropped.

A stdout redirected to a file that cannot be written (full disk, quota, RLIMIT_FSIZE) is no
hang-up: its lines are dropped, `on_fault` is told once per errno and `on_recovered` when a
line gets through again. Lines go straight to the file descriptor (`RawOut`), so nothing
waits in a buffer that the interpreter's final flush would fail on (exit code 120). Write
faults (`WriteFailing`, `WriteRecovered`) are also printed on stderr when it is another
file than stdout, so a full stdout does not hide them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from typing import IO, cast

from rich.console import Console
from rich.text import Text

# From status, not store.store: `srtr tui` imports this module, and store.store brings in
# 0.2 s of imports it never uses.
from srtr.store.status import Event, EventType

# Per-instance lines that would flood a 4,096-instance job's terminal; they stay in
# events.jsonl and the stage/tier summaries still print.
_QUIET_AT_SCALE = {"Launched", "Ready", "Exited"}
QUEUE_LINES = 10_000
# The reason column fits the longest event reason (RestartRequested), so that the object
# column starts at the same place on every line (reasons of 13+ characters used to push it
# right). A longer, new reason would still print whole.
REASON_WIDTH = 16
# Events about srtr's own files: printed on stderr too, which may be on another disk.
WRITE_FAULT_REASONS = frozenset(
    {"WriteFailing", "WriteRecovered", "EventsDropped", "RunDirRecreated"}
)


class RawOut:
    """A text file on a file descriptor, with no buffer of its own (for Rich's Console).

    A failed write leaves nothing behind for a later flush; `console()` makes the Console.
    """

    encoding = "utf-8"

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, text: str) -> int:
        view = memoryview(text.encode("utf-8", "replace"))
        while view:
            view = view[os.write(self.fd, view) :]
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def fileno(self) -> int:
        return self.fd

    def console(self) -> Console:
        return Console(file=cast(IO[str], self), highlight=False)


def _regular_file(console: Console) -> bool:
    try:
        return stat.S_ISREG(os.fstat(console.file.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # io.StringIO has no fileno
        return False


def _same_file(fd_a: int, fd_b: int) -> bool:
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return True
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class ProgressPrinter:
    def __init__(
        self,
        console: Console,
        instance_count: int,
        on_lost: Callable[[int | None], None] = lambda errno: None,
        on_fault: Callable[[OSError], None] = lambda exc: None,
        on_recovered: Callable[[], None] = lambda: None,
        stderr_fd: int | None = 2,
    ) -> None:
        self.console = console
        self.on_lost = on_lost
        self.on_fault = on_fault
        self.on_recovered = on_recovered
        self._lost = False
        self._fault: int | None = None  # errno of the failing stdout file
        # A file can be full; a terminal or pipe that fails is gone (a hang-up).
        self._file = _regular_file(console)
        out = self._fileno(console)
        separate = stderr_fd is not None and out is not None and not _same_file(out, stderr_fd)
        self._stderr = stderr_fd if separate else None
        self.quiet = instance_count > 64
        self._lines: queue.Queue[tuple[Text, bool] | None] = queue.Queue(maxsize=QUEUE_LINES)
        self._dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._write, name="srtr-progress", daemon=True)
        self._thread.start()

    @staticmethod
    def _fileno(console: Console) -> int | None:
        try:
            return console.file.fileno()
        except (OSError, ValueError, AttributeError):
            return None

    def __call__(self, event: Event) -> None:
        if self.quiet and event.reason in _QUIET_AT_SCALE and event.type is EventType.NORMAL:
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
        line = Text(f"{stamp} ")
        style = "yellow" if event.type is EventType.WARNING else "cyan"
        line.append(f"{event.reason:<{REASON_WIDTH}}", style=style)
        line.append(f" {event.object}: ", style="bold")
        line.append(event.message)
        self.print(line, stderr=event.reason in WRITE_FAULT_REASONS)

    def print(self, line: Text | str, *, stderr: bool = False) -> None:
        """Queue a line (also for stderr: `stderr`); never blocks."""
        try:
            self._lines.put_nowait((Text(line) if isinstance(line, str) else line, stderr))
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued, waiting at most `timeout` for a slow reader."""
        try:
            self._lines.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _write(self) -> None:
        while (item := self._lines.get()) is not None:
            line, stderr = item
            if stderr and self._stderr is not None:
                with contextlib.suppress(OSError):
                    os.write(self._stderr, (line.plain + "\n").encode("utf-8", "replace"))
            if self._lost:
                continue
            try:
                self._print(line)
            except OSError as exc:
                if not self._file:
                    self._lose(exc.errno)  # a terminal or a pipe: gone
                elif exc.errno != self._fault:
                    self._fault = exc.errno
                    self.on_fault(exc)
            else:
                if self._fault is not None:
                    self._fault = None
                    self.on_recovered()

    def _print(self, line: Text) -> None:
        """Render with Rich, write ourselves: a failed write must not stay in Rich's buffer
        (it would come out again with the next line)."""
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        with self.console.capture() as capture:
            if dropped:
                self.console.print(
                    f"... {dropped} progress line(s) dropped: stdout is not "
                    "being read (events.jsonl has every event)",
                    style="yellow",
                )
            self.console.print(line, soft_wrap=True, highlight=False)
        self.console.file.write(capture.get())
        self.console.file.flush()

    def _lose(self, errno: int | None) -> None:
        self._lost = True
        self.on_lost(errno)


def detach_terminal() -> None:
    """Point stdin, stdout and stderr at /dev/null: the terminal they were is gone.

    Nothing can then raise or block on it: not Textual's shutdown, not a late print, not
    the interpreter's final flush of stdout (which would turn the exit code into 120).
    """
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
        os.close(null)
