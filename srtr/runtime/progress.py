"""Plain progress lines for `srtr up --headless`: one line per event, warnings in colour.

Lines are written by a thread of their own through a bounded queue, so a terminal or pipe
that stops reading (`srtr up | less`, a full pipe nobody drains) can never stall the
controller: when the queue is full, lines are counted and dropped, and a note says how many.
events.jsonl always has every event.

A terminal that hangs up (EIO) or a pipe whose reader left (EPIPE) is reported once through
`on_lost`; `srtr up` treats that as a hang-up (issue 12). Lines are then dropped.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from srtr.reconciler.store import Event, EventType

# Per-instance lines that would flood a 4,096-instance job's terminal; they stay in
# events.jsonl and the stage/tier summaries still print.
_QUIET_AT_SCALE = {"Launched", "Ready", "Exited"}
QUEUE_LINES = 10_000


class ProgressPrinter:
    def __init__(
        self,
        console: Console,
        instance_count: int,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.console = console
        self.on_lost = on_lost
        self._lost = False
        self.quiet = instance_count > 64
        self._lines: queue.Queue[Text | None] = queue.Queue(maxsize=QUEUE_LINES)
        self._dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._write, name="srtr-progress", daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        if self.quiet and event.reason in _QUIET_AT_SCALE and event.type is EventType.NORMAL:
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
        line = Text(f"{stamp} ")
        style = "yellow" if event.type is EventType.WARNING else "cyan"
        line.append(f"{event.reason:<12}", style=style)
        line.append(f" {event.object}: ", style="bold")
        line.append(event.message)
        self.print(line)

    def print(self, line: Text | str) -> None:
        """Queue a line; never blocks."""
        try:
            self._lines.put_nowait(Text(line) if isinstance(line, str) else line)
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
        while (line := self._lines.get()) is not None:
            if self._lost:
                continue
            with self._lock:
                dropped, self._dropped = self._dropped, 0
            try:
                if dropped:
                    self.console.print(
                        f"... {dropped} progress line(s) dropped: stdout is not "
                        "being read (events.jsonl has every event)",
                        style="yellow",
                    )
                self.console.print(line, soft_wrap=True, highlight=False)
            except (OSError, SystemExit):  # Rich raises SystemExit on a broken pipe
                self._lost = True
                self.on_lost()


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
