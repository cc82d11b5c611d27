"""Reading a run dir as it changes: state.json, events.jsonl and one instance's log.

The TUI only reads files and sends intents; this module is the reading half. It polls:
`RunSource.poll()` is called every 0.25 s (from a thread, see `app.py`) and touches a file
only when `stat` says it changed:

- state.json is re-read and parsed when its inode, size or mtime changed (the controller
  replaces it atomically, so each write is a new inode);
- events.jsonl and the followed log are tailed from a saved byte offset: every appended
  byte is read exactly once, a partial last line is carried over until its newline
  arrives, and a huge line is handed over in pieces instead of being dropped or
  buffered without bound. One poll reads at most `max_read` bytes per file, so a
  fast writer makes the view lag a little rather than freeze it; the next poll goes on
  where this one stopped.

Why poll rather than watch (inotify/watchfiles): run dirs live on shared filesystems
(NFS, Lustre) on SLURM clusters, and `srtr tui` runs on a login node while the
controller writes from a compute node: inotify never sees those writes, a stat does.
Four stats a second cost nothing; the controller writes state.json at most 5 times a
second anyway.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srtr.store.rundir import (
    EVENTS_FILE,
    MARKER_PREFIX,
    EventDoc,
    RunState,
    StateFileError,
    parse_event,
    parse_restart_marker,
    read_heartbeat,
    read_state,
)
from srtr.store.state_follow import StateFollower

MAX_READ = 4 * 1024 * 1024
MAX_LINE = 1024 * 1024
# How much of an existing log a newly selected instance shows, and how much more each
# "load earlier lines" adds: whole logs of thousands of lines load at once.
LOG_TAIL = 4 * 1024 * 1024
COUNT_LIMIT = 16 * 1024 * 1024  # beyond this, lines not loaded are given in bytes
_SCAN = 64 * 1024


def _utf8_cut(data: bytes, limit: int) -> int:
    """An index <= limit that does not split a UTF-8 character."""
    cut = min(limit, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut or limit


class LineTail:
    """Incremental reader of an append-only file: complete lines only, none lost.

    A file that shrinks or is replaced (new inode) is read again from the start.
    """

    def __init__(
        self, path: Path, offset: int = 0, *, max_read: int = MAX_READ, max_line: int = MAX_LINE
    ) -> None:
        self.path = path
        self.offset = offset
        self.max_read = max_read
        self.max_line = max_line
        self._partial = b""
        self._inode: int | None = None
        self.behind = False  # more bytes were waiting when the last read stopped
        self.restarted = False  # the last read found the file truncated or replaced

    def read(self) -> list[str]:
        self.restarted = False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.behind = False
            return []
        if self._inode is None:
            self._inode = st.st_ino
        elif st.st_ino != self._inode or st.st_size < self.offset:
            self._inode = st.st_ino
            self.offset, self._partial, self.restarted = 0, b"", True
        if st.st_size == self.offset:
            self.behind = False
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read(self.max_read)
        self.offset += len(data)
        self.behind = self.offset < st.st_size
        return self._lines(data)

    def unchanged(self) -> bool:
        """Whether a read now would return nothing and change nothing (one stat)."""
        if self.behind:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        return st.st_ino == self._inode and st.st_size == self.offset

    def _lines(self, data: bytes) -> list[str]:
        buffer = self._partial + data
        parts = buffer.split(b"\n")
        self._partial = parts.pop()
        out = [p.decode("utf-8", "replace") for p in parts]
        # A line longer than max_line is handed over in pieces rather than held forever.
        while len(self._partial) > self.max_line:
            cut = _utf8_cut(self._partial, self.max_line)
            out.append(self._partial[:cut].decode("utf-8", "replace"))
            self._partial = self._partial[cut:]
        return out


def last_marker_offset(path: Path, end: int | None = None) -> int | None:
    """Byte offset of the last restart-marker line before `end`, scanning backwards."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END) if end is None else end
            position = size
            carry = b""
            while position > 0:
                start = max(0, position - _SCAN)
                handle.seek(start)
                block = handle.read(position - start) + carry
                index = len(block)
                while True:
                    index = block.rfind(MARKER_PREFIX, 0, index)
                    if index < 0:
                        break
                    stop = block.find(b"\n", index)
                    rest = block[index : None if stop < 0 else stop]
                    if parse_restart_marker(rest.decode("utf-8", "replace")):
                        return start + index
                # Keep the first (possibly cut) line for the next, earlier block.
                first = block.find(b"\n")
                carry = block if first < 0 else block[: first + 1]
                if len(carry) > MAX_LINE:
                    carry = b""
                position = start
    except FileNotFoundError:
        return None
    return None


def _align(handle: Any, start: int) -> int:
    """Move `start` to the beginning of the next line (a tail must not begin mid-line)."""
    if start == 0:
        return 0
    handle.seek(start - 1)
    if handle.read(1) == b"\n":
        return start
    rest = handle.read(MAX_LINE)
    newline = rest.find(b"\n")
    return start if newline < 0 else start + newline + 1


def _line_start(handle: Any, end: int, floor: int) -> int:
    """Where the line that ends at `end` begins (not before `end - MAX_LINE`, nor `floor`)."""
    start = max(0, floor - MAX_LINE, end - 1 - MAX_LINE)
    handle.seek(start)
    newline = handle.read(max(0, end - 1 - start)).rfind(b"\n")
    return start if newline < 0 else start + newline + 1


@dataclass
class LogChunk:
    """Lines for the log view. `reset` means: clear the view first (another log or mode);
    `earlier` means: these lines come before those shown (loaded on request)."""

    key: tuple[str, str, bool]
    lines: list[str]
    reset: bool
    skipped: int = 0  # bytes before the first line shown
    note: str = ""
    earlier: bool = False
    # Lines of this view (this attempt, or the log before it) that are not loaded yet; a
    # count when there are at most COUNT_LIMIT bytes of them to count, else None.
    not_loaded_lines: int | None = 0
    not_loaded_bytes: int = 0


class LogFollower:
    """The selected instance's log: its current attempt (followed), or the text before the
    last restart marker (`previous`, a fixed view).

    The view starts with the last `tail` bytes of what it shows; `earlier()` reads the
    `tail` bytes before those, down to where the view begins (its restart marker, or the
    start of the file for the previous view).
    """

    def __init__(self, path: Path, key: tuple[str, str, bool], tail: int = LOG_TAIL) -> None:
        self.path = path
        self.key = key
        self.previous = key[2]
        self.tail_bytes = tail
        self._tail: LineTail | None = None
        self._started = False
        self.floor = 0  # where this view begins in the file
        self.first = 0  # where its first loaded line begins

    @property
    def behind(self) -> bool:
        return self._tail is not None and self._tail.behind

    def read(self) -> LogChunk:
        if not self._started:
            self._started = True
            return self._first()
        if self._tail is None:
            return LogChunk(self.key, [], reset=False)
        lines = self._tail.read()
        if self._tail.restarted:
            self.floor = self.first = 0
            return LogChunk(self.key, lines, reset=True, note="the log was truncated")
        return LogChunk(self.key, lines, reset=False)

    def unchanged(self) -> bool:
        """Whether a read now would bring nothing (it has begun, and its file holds still)."""
        return self._started and (self._tail is None or self._tail.unchanged())

    def earlier(self) -> LogChunk:
        """The lines before the first loaded one (up to `tail` bytes of them)."""
        if self.first <= self.floor:
            return self._chunk([], reset=False, earlier=True)
        lines, start = self._range(max(self.floor, self.first - self.tail_bytes), self.first)
        self.first = start
        return self._chunk(lines, reset=False, earlier=True)

    def _chunk(self, lines: list[str], *, reset: bool, earlier: bool = False) -> LogChunk:
        missing = self.first - self.floor
        count = self._count_lines(self.floor, self.first) if missing <= COUNT_LIMIT else None
        return LogChunk(
            self.key,
            lines,
            reset=reset,
            skipped=self.first,
            earlier=earlier,
            not_loaded_lines=count,
            not_loaded_bytes=missing,
        )

    def _first(self) -> LogChunk:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            self._tail = None if self.previous else LineTail(self.path)
            return LogChunk(self.key, [], reset=True, note="no output yet")
        marker = last_marker_offset(self.path, size)
        if self.previous:
            if marker is None:
                return LogChunk(self.key, [], reset=True, note="no restart yet: no previous log")
            lines, self.first = self._range(max(0, marker - self.tail_bytes), marker)
            return self._chunk(lines, reset=True)
        self.floor = marker or 0
        start = max(self.floor, size - self.tail_bytes)
        with open(self.path, "rb") as handle:
            start = start if start == marker else _align(handle, start)
        self.first = start
        self._tail = LineTail(self.path, start)
        lines = self._tail.read()
        while self._tail.behind and len(lines) < 100_000:
            lines += self._tail.read()
        return self._chunk(lines, reset=True)

    def _range(self, start: int, end: int) -> tuple[list[str], int]:
        with open(self.path, "rb") as handle:
            aligned = _align(handle, start)
            # A line longer than the range: load that whole line (up to MAX_LINE bytes).
            start = aligned if aligned < end else _line_start(handle, end, start)
            handle.seek(start)
            data = handle.read(max(0, end - start))
        text = data.decode("utf-8", "replace")
        return text.splitlines(), start

    def _count_lines(self, start: int, end: int) -> int:
        count = 0
        with open(self.path, "rb") as handle:
            handle.seek(start)
            while start < end:
                block = handle.read(min(1024 * 1024, end - start))
                if not block:
                    break
                count += block.count(b"\n")
                start += len(block)
        return count


@dataclass
class Poll:
    """What changed since the previous poll."""

    state: RunState | None = None  # a new snapshot, or None when unchanged
    # The instances `state` changed since the previous one (None: unknown, maybe all).
    changed: frozenset[str] | None = None
    events: list[EventDoc] = field(default_factory=list)
    log: LogChunk | None = None
    error: str = ""


class RunSource:
    """Everything the TUI reads from one run dir. Not thread-safe: one poll at a time.

    The UI sets `want_log` (instance name, log path relative to the run dir, previous?)
    from the event loop; the next poll, run in a worker thread, follows that log.
    """

    def __init__(self, run_dir: Path, *, tail_bytes: int = LOG_TAIL) -> None:
        self.run_dir = run_dir
        self.want_log: tuple[str, str, bool] | None = None
        # Set to `want_log` to load the lines before the first one shown, on the next poll.
        self.want_earlier: tuple[str, str, bool] | None = None
        self.tail_bytes = tail_bytes
        self._state = StateFollower(run_dir)
        self._events = LineTail(run_dir / EVENTS_FILE)
        self._log: LogFollower | None = None
        # Cleared by a reader that wants state.json less often than every poll (its cost).
        self.state_due = True
        # A reader that keeps only the last N events: a poll parses no more than those (a
        # big job's start appends hundreds of thousands).
        self.events_kept: int | None = None

    def poll(self) -> Poll:
        """What changed (state.json only if `state_due`; else it waits for a later poll)."""
        out = Poll()
        try:
            out.state = self._read_state() if self.state_due else None
            out.changed = self._state.changed if out.state is not None else None
        except StateFileError as exc:
            out.error = f"cannot read state.json: {exc}"
        lines = self._events.read()
        if self.events_kept is not None:
            lines = lines[-self.events_kept :]  # the older ones would be dropped unseen
        for line in lines:
            event = parse_event(line)
            if event is not None:  # else not a whole event (a writer killed mid-line)
                out.events.append(event)
        want = self.want_log
        if want is None:
            self._log = None
        else:
            if self._log is None or self._log.key != want:
                self._log = LogFollower(self.run_dir / want[1], want, self.tail_bytes)
            if self.want_earlier == want and self._log._started:
                out.log = self._log.earlier()
            else:
                out.log = self._log.read()
        self.want_earlier = None
        return out

    def unchanged(self) -> bool:
        """Whether a poll now would find nothing: a few stats on the caller's thread, so that
        an idle view costs no hop to a reading thread (state.json only if `state_due`)."""
        log, want = self._log, self.want_log
        if self.want_earlier is not None or (log.key if log is not None else None) != want:
            return False
        if log is not None and not log.unchanged():
            return False
        return self._events.unchanged() and (not self.state_due or self._state.unchanged())

    def state_unchanged(self) -> bool:
        """Whether the state's files hold still since its last read (two stats)."""
        return self._state.unchanged()

    @property
    def behind(self) -> bool:
        """More appended bytes are waiting: poll again at once."""
        return self._events.behind or (self._log is not None and self._log.behind)

    def first_state(self) -> RunState:
        """Read state.json now (the App's first poll then reads it only if it changed since).
        Raises StateFileError as `read_state` does."""
        state = self._state.read()
        return state if state is not None else read_state(self.run_dir)

    def _read_state(self) -> RunState | None:
        """The state if it changed since the last read (None: it did not, or there is none
        yet): a big job's appended delta lines only, not its whole snapshot again. Raises
        StateFileError for a file that cannot be read."""
        return self._state.read()


def controller_beats(run_dir: Path, now: float) -> bool:
    """The job's controller beats (its heartbeat file is fresh): from any host, no pid."""
    heartbeat = read_heartbeat(run_dir)
    return heartbeat is not None and heartbeat.fresh(now)
