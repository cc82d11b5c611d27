"""The TUI's key thread sleeps until a key comes, ticks for an Escape's timeout only after a
key, and wakes at once when the App stops reading keys."""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import threading
import tty
from typing import Any

import pytest
from textual import events
from textual.message import Message

from srtr.tui import terminal


class _Keys(terminal.HangupSafeDriver):
    """The driver's key thread on a pty of the test's, its messages kept."""

    def __init__(self, tty: int) -> None:
        super().__init__(app=None)
        self.fileno = tty
        self.got: list[Message] = []
        self.seen = threading.Event()

    def process_message(self, message: Message) -> None:
        self.got.append(message)
        self.seen.set()


def test_the_key_thread_sleeps_until_a_key_and_wakes_when_keys_are_no_longer_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timeouts: list[float | None] = []

    class Recording(selectors.SelectSelector):
        def select(self, timeout: float | None = None) -> Any:
            timeouts.append(timeout)
            return super().select(timeout)

    monkeypatch.setattr(selectors, "SelectSelector", Recording)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}
    master, slave = os.openpty()
    tty.setraw(slave)  # keys as typed, not lines (as Textual sets its terminal)

    async def scenario() -> None:
        keys = _Keys(slave)
        thread = threading.Thread(target=keys.run_input_thread, daemon=True)
        thread.start()
        os.write(master, b"a")
        assert keys.seen.wait(10), "the key is read"
        assert isinstance(keys.got[0], events.Key) and keys.got[0].key == "a"
        assert timeouts[0] is None, "no key yet: asleep until one comes"
        keys.exit_event.set()
        thread.join(10)
        assert not thread.is_alive(), "the App stopped reading keys: the thread ends"
        assert terminal.TICK in timeouts, "after a key it looks for an Escape's timeout"

    try:
        asyncio.run(scenario())
    finally:
        os.close(master)
        os.close(slave)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
