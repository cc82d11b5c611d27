"""The cyclic collector while a job runs: what survived its last full pass is frozen.

A job's plan and store live as long as it does, and every launch adds objects that live as
long (conditions, history, live attempts). The collector's full pass walks every object it
tracks; with 80,000 instances that was 3 of a launch's 60 seconds of CPU, in pauses of up
to 0.8 s, and freezing once at the start moved the cost to more frequent passes over what
each launch added. So after each full pass its survivors are frozen too (`gc.freeze`): a
pass then walks only what is newer than the last one.

A frozen object is never collected as part of a cycle, so once every `THAW_PERIOD` the
frozen objects go back and one full pass frees the cycles that ended among them.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

THAW_PERIOD = 600.0  # s between the full passes over everything


class Freezer:
    """Started with the job's loop running; `stop` gives the collector everything back."""

    def __init__(self, thaw_period: float = THAW_PERIOD) -> None:
        self.thaw_period = thaw_period
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = False  # a freeze is scheduled on the loop
        self._thawed_at = 0.0
        self.freezes = 0  # how many times survivors were frozen (tests)

    def start(self) -> None:
        """Freeze what exists now (the plan, the store) and collect again: `srtr up` plans
        with the collector off, as `srtr plan` does, since nothing it builds is garbage."""
        self._loop = asyncio.get_running_loop()
        self._thawed_at = time.monotonic()
        gc.freeze()
        gc.callbacks.append(self._collected)
        gc.enable()

    def stop(self) -> None:
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        self._loop = None
        gc.unfreeze()  # a process that runs jobs one after another (tests) frees them

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        # Called inside the collector, in whatever thread allocated: only schedule here.
        if phase != "stop" or info.get("generation") != 2 or self._due:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        self._due = True
        loop.call_soon_threadsafe(self._freeze)

    def _freeze(self) -> None:
        self._due = False
        if self._loop is None:
            return
        now = time.monotonic()
        if now - self._thawed_at >= self.thaw_period:
            self._thawed_at = now
            gc.unfreeze()
            gc.collect()  # its own callback asks for the freeze that follows
            return
        gc.freeze()
        self.freezes += 1
