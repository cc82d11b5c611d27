"""Write faults: a file srtr cannot write never costs it the job; it is reported, once.

The store is the truth and the run dir's files are a report of it. Every writer (state.json,
events.jsonl, logs/srtr.log, progress lines, the recipe copies, prometheus/targets.json, the
instances' logs) runs its write through `WriteFaults.attempt` or tells `failed`/`ok` itself.
A failed write (ENOSPC, EDQUOT, EROFS, EIO, EFBIG, a vanished directory, ...) never raises
into a reconcile, a timer or the TUI: it records one Warning event `WriteFailing` per file and
errno, and one `WriteRecovered` when that file is written again. What is failing now is
state.json's `job.write_faults`.

A vanished run dir is recreated through `restore_run_dir`, which the runtime wires up (the
store does not know where the run dir is). Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import errno as errnos
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from srtr.store.rundir import WriteFaultDoc

# One fault kind for every instance's log (logs/<instance>.out): a read-only run dir must not
# record one event per instance of a 4,096-instance job.
INSTANCE_LOGS = "logs/<instance>.out"


class Recorder(Protocol):
    def record(self, obj: str, reason: str, message: str, *, warning: bool = False) -> Any: ...

    def changed(self) -> None: ...


@dataclass
class WriteFault:
    target: str  # the file, relative to the run dir ("state.json"), or "stdout"
    errno: int
    error: str  # "ENOSPC: No space left on device"
    since: float  # Unix seconds
    failures: int = 1

    def to_json(self) -> WriteFaultDoc:
        return {
            "file": self.target,
            "errno": errnos.errorcode.get(self.errno, str(self.errno)),
            "error": self.error,
            "since": round(self.since, 3),
            "failures": self.failures,
        }


def describe(exc: OSError) -> str:
    """`ENOSPC: No space left on device`, or the exception's text for errno-less errors."""
    if exc.errno is None:
        return str(exc) or type(exc).__name__
    name = errnos.errorcode.get(exc.errno, f"errno {exc.errno}")
    return f"{name}: {exc.strerror or os.strerror(exc.errno)}"


class WriteFaults:
    """Which files cannot be written now; reports each kind of fault once, and its end."""

    def __init__(self, store: Recorder) -> None:
        self._store = store
        self.failing: dict[str, WriteFault] = {}
        self._restore: Callable[[], bool] = lambda: False

    def failed(self, target: str, exc: OSError, consequence: str = "") -> None:
        """A write of `target` failed: a WriteFailing event unless this fault is known."""
        code = exc.errno or 0
        known = self.failing.get(target)
        if known is not None and known.errno == code:
            known.failures += 1
            return
        fault = WriteFault(target, code, describe(exc), time.time())
        if known is not None:
            fault.failures = known.failures + 1
        self.failing[target] = fault  # before recording: the record may fail to write too
        message = f"cannot write {target}: {fault.error}; {consequence or _GOES_ON}"
        self._store.record("job", "WriteFailing", message, warning=True)

    def ok(self, target: str) -> None:
        """`target` was written: a WriteRecovered event if it was failing."""
        fault = self.failing.pop(target, None)
        if fault is None:
            return
        since = time.strftime("%H:%M:%S", time.localtime(fault.since))
        self._store.record(
            "job",
            "WriteRecovered",
            f"{target} is written again ({fault.failures} failed write(s) since {since})",
        )

    def attempt(self, target: str, write: Callable[[], object], consequence: str = "") -> bool:
        """Run `write`; True when it worked. A failure is reported, never raised.

        A FileNotFoundError (the run dir or a directory in it vanished) gets one more try
        after `restore_run_dir`.
        """
        try:
            try:
                write()
            except FileNotFoundError:
                if not self.restore_run_dir():
                    raise
                write()
        except OSError as exc:
            self.failed(target, exc, consequence)
            return False
        self.ok(target)
        return True

    def dropped_events(self, count: int, since: float, limit: int) -> None:
        """More events than memory keeps waited for events.jsonl: say how many are gone."""
        at = time.strftime("%H:%M:%S", time.localtime(since))
        self._store.record(
            "job",
            "EventsDropped",
            f"{count} event(s) from {at} on were never written to events.jsonl: more than "
            f"{limit} waited in memory while it could not be written",
            warning=True,
        )

    def set_restore(self, restore: Callable[[], bool] | None) -> None:
        """How to recreate a vanished run dir (the runtime's); None: never."""
        self._restore = restore if restore is not None else lambda: False

    def restore_run_dir(self) -> bool:
        """Recreate the run dir and logs/ if they vanished; True when they exist now."""
        return self._restore()

    def to_json(self) -> list[WriteFaultDoc]:
        return [fault.to_json() for fault in self.failing.values()]


_GOES_ON = "the job goes on (its state is kept in memory); retrying"


def open_log(faults: WriteFaults, path: Path) -> tuple[Path, int]:
    """An instance's log and its size now (where this attempt's output begins), or
    /dev/null when it cannot be opened (reported as a fault).

    srtr's files never decide whether an instance runs: an attempt whose log cannot be
    opened (a read-only run dir) runs with its output discarded rather than failing to
    launch. A vanished logs/ is recreated first. One open answers both questions: a stage
    of 10,000 launches opens 10,000 logs.
    """
    size = 0

    def touch() -> None:
        nonlocal size
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW  # no link
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:  # logs/ vanished; a vanished run dir is `restore_run_dir`'s
            path.parent.mkdir(exist_ok=True)
            fd = os.open(path, flags, 0o644)
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)

    consequence = (
        f"this attempt of {path.stem}, as any other whose log cannot be opened, runs with "
        "its output discarded"
    )
    if faults.attempt(INSTANCE_LOGS, touch, consequence):
        return path, size
    try:
        return Path(os.devnull), path.stat().st_size  # its output so far, if it can be read
    except OSError:
        return Path(os.devnull), 0
