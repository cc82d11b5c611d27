"""A Textual driver that survives its terminal going away (a closed window, a dropped ssh).

Textual's LinuxDriver writes from a thread through a bounded queue. When the terminal
hangs up, the write raises EIO, the writer thread dies, the queue fills, and the next
refresh blocks the event loop for ever in `Queue.put` (`srtr up` would never exit after a
hang-up). Reading the dead terminal raises EIO too, which Textual turns into a
panic with a traceback.

`HangupSafeDriver` catches both. The first failed read or write calls `on_lost` once, from
whatever thread saw it, and from then on the output is dropped. `detach_terminal` points
fds 0, 1 and 2 at /dev/null so that nothing else (Textual's shutdown, Rich, the
interpreter's final flush of stdout) can raise or block on the dead terminal either.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Callable
from typing import IO, Any, cast

from textual.drivers.linux_driver import LinuxDriver

from srtr.runtime.progress import detach_terminal

__all__ = ["HangupSafeDriver", "detach_terminal"]


class _Output:
    """The terminal as a file for Textual's writer thread: a failure reports the loss once."""

    def __init__(self, file: IO[str], on_lost: Callable[[], None]) -> None:
        self._file = file
        self._on_lost = on_lost
        self._lost = False

    def _fail(self) -> None:
        if not self._lost:
            self._lost = True
            self._on_lost()

    def write(self, text: str) -> int:
        if not self._lost:
            try:
                return self._file.write(text)
            except (OSError, ValueError):
                self._fail()
        return len(text)

    def flush(self) -> None:
        if not self._lost:
            try:
                self._file.flush()
            except (OSError, ValueError):
                self._fail()

    def fileno(self) -> int:
        return self._file.fileno()

    def isatty(self) -> bool:
        return True


class HangupSafeDriver(LinuxDriver):
    """LinuxDriver whose reads and writes never raise or block on a dead terminal.

    On the first failure it calls the App's `terminal_lost()` on the event loop, once.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lost_once = threading.Lock()
        self._reported = False
        # Textual types its file as the interpreter's stderr; ours stands in for it.
        self._file = cast(io.TextIOWrapper, _Output(cast(IO[str], self._file), self._lost))

    def _lost(self) -> None:
        with self._lost_once:
            if self._reported:
                return
            self._reported = True
        handler = getattr(self._app, "terminal_lost", None)
        if handler is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to tell
                self._loop.call_soon_threadsafe(handler)

    def run_input_thread(self) -> None:
        try:
            super().run_input_thread()
        except OSError:  # EIO: the terminal hung up while we waited for keys
            self._lost()
