"""A program on a real pseudo-terminal: its screen as a terminal shows it, keys, and hang-up.

The program runs in its own session with the pty as its controlling terminal, as a login
shell's job does, so closing the master side hangs up the terminal exactly as a closed
terminal window or a dropped ssh connection does: the kernel sends SIGHUP and every later
read or write of the terminal fails with EIO. `pyte` renders the output into a screen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from pathlib import Path

import pyte


def _take_terminal() -> None:
    """In the child, after setsid: make the pty on fd 0 the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtyProgram:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        columns: int = 140,
        lines: int = 45,
    ) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(lines)},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_take_terminal,  # after setsid: the pty becomes the controlling tty
        )
        os.close(slave)
        self.raw = bytearray()
        self.closed = False

    def pump(self, timeout: float = 0.05) -> None:
        """Read what the program wrote; feed it to the screen."""
        if self.closed:
            return
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every slave fd is closed (the program exited)
            data = b""
        if data:
            self.raw += data
            self.stream.feed(data)

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for_text(self, *needles: str, timeout: float = 30.0) -> str:
        """Pump until every needle is on the screen; return the screen."""
        deadline = time.monotonic() + timeout
        while True:
            self.pump()
            screen = self.text()
            if all(needle in screen for needle in needles):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {needles} on screen:\n{screen}")
            if self.proc.poll() is not None:
                self.pump(0.2)
                raise AssertionError(
                    f"the program exited ({self.proc.returncode}) before {needles} showed:\n"
                    f"{self.text()}"
                )

    def send(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def hang_up(self) -> None:
        """Close the terminal: the master side goes away, as when its window is closed."""
        if not self.closed:
            self.closed = True
            os.close(self.master)

    def wait(self, timeout: float) -> int:
        """Wait for the program to exit, still draining its output (a full pty would block it)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"pid {self.proc.pid} still runs {timeout:g}s later; screen:\n{self.text()}"
                )
            if self.closed:  # nothing to drain: just wait for the exit
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(left)
            else:
                self.pump(min(0.05, left))
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.hang_up()
