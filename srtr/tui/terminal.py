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

Its key thread also sleeps until a key comes (or the App stops reading keys): Textual's
wakes ten times a second for ever, to time out an Escape that starts no sequence, which
only a key read before can begin; an idle TUI spent a tenth of its CPU on those wakes.
"""

from __future__ import annotations

import contextlib
import io
import os
import selectors
import threading
import time
from codecs import getincrementaldecoder
from collections.abc import Callable, Iterator
from typing import IO, Any, cast

from textual import constants
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

from srtr.runtime.progress import detach_terminal

__all__ = ["HangupSafeDriver", "detach_terminal"]

TICK = 0.1  # s: how often the key parser looks for a timed-out sequence, as Textual's does
# s after a key during which it does: beyond the longest timeout a key can start (an Escape
# that begins no sequence: ESCDELAY, 0.1 s unless the environment says otherwise).
TICKING = max(1.0, 2 * constants.ESCAPE_DELAY)


class _WakingEvent(threading.Event):
    """Textual's `exit_event` for the key thread, which also wakes the thread from its sleep
    (through a pipe of its own, for as long as it reads keys: `waker`)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._wake = -1  # the pipe's write end while a key thread sleeps on its read end

    def set(self) -> None:
        super().set()
        with self._lock:
            if self._wake >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._wake, b"x")

    @contextlib.contextmanager
    def waker(self) -> Iterator[int]:
        """A pipe's read end that becomes readable when the event is set."""
        read, write = os.pipe()
        with self._lock:
            self._wake = write
        try:
            yield read
        finally:
            with self._lock:
                self._wake = -1
            os.close(read)
            os.close(write)


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
        self._exit = self.exit_event = _WakingEvent()

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
            self._read_keys()
        except OSError:  # EIO: the terminal hung up while we waited for keys
            self._lost()

    def _read_keys(self) -> None:
        """Textual's key loop (`LinuxDriver.run_input_thread`), asleep while no key came
        for TICKING seconds: the parser's timeouts start only with a key."""
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        ticking_until = 0.0
        with self._exit.waker() as wake, selectors.SelectSelector() as selector:
            selector.register(self.fileno, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while not self.exit_event.is_set():
                timeout = TICK if time.monotonic() < ticking_until else None
                if any(key.fd == self.fileno for key, _ in selector.select(timeout)):
                    data = os.read(self.fileno, 4096)
                    if not data:  # the end of a piped stdin: no more keys, ever
                        selector.unregister(self.fileno)
                    ticking_until = time.monotonic() + TICKING
                    for event in parser.feed(decode(data)) if data else ():
                        self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)
            # As Textual's: what was typed before the App stopped reading keys is handled.
            if any(key.fd == self.fileno for key, _ in selector.select(TICK)):
                for event in parser.feed(decode(os.read(self.fileno, 4096), final=True)):
                    self.process_message(event)
        with contextlib.suppress(Exception):
            for _event in parser.feed(""):
                pass
