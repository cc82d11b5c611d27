"""Following a run dir's state from a reader that polls often (the TUI).

`rundir.read_state` reads state.json and the whole delta log each time: right for a verb that
reads once, too much for a reader that polls a big job every second (a 60 MB snapshot parsed
again for each line the controller appends). `StateFollower` reads only the delta log's lines
appended since its last read, applied to a copy that shares unchanged records with the
previous document, and says which instances those lines changed (`changed`), so that a view
of 80,000 rows redraws the few that did.

A compaction does not make it read the new snapshot: the writer appends the line that makes
the log outgrow the snapshot first, and the snapshot then includes no more than that line
(the same `seq`, which compose writes last: the file's tail says it). The follower keeps the
log open, so it reads the old log to its end even after the writer removed it, and then
holds the snapshot's state already: it only reads the new log. state.json is read whole
(`whole_reads` counts it) for the first read, for a small job's every write (no `seq`), and
when it includes changes the follower did not read (a live edit, a failed write, the job's
last write, or a follower that fell more than one compaction behind).

A replaced snapshot is read by `rundir.read_state` (orjson, the garbage collector paused),
and new lines are taken by `state_delta.following`, as every reader takes them.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import IO, Any

from srtr.store.rundir import STATE_FILE, RunState, read_state
from srtr.store.state_delta import DELTA_FILE, SEQ, apply_one, following

Stamp = tuple[int, int, int]
Doc = dict[str, Any]
# A snapshot's last bytes: `"seq":N}` closes it (`state_log.compose`); a whole state.json
# (no seq) or one written otherwise does not match, and is read whole.
_TAIL = re.compile(rb'"seq":(\d+)\}\s*\Z')
_TAIL_BYTES = 64
_HEAD = re.compile(rb'\{\s*"seq"\s*:\s*(\d+)')  # a delta line's first key


class StateFollower:
    """The state of one run dir, read again only where it changed."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._snapshot: Stamp | None = None  # state.json as last read (inode, mtime, size)
        self._state: RunState | None = None
        self._seq: int | None = None  # a snapshot's last change applied (None: a whole file)
        self._log: IO[bytes] | None = None  # the delta log being read, kept open
        self._log_ino = 0
        self._offset = 0  # the bytes of `_log` read
        # Where each record of a list section sits (by `item_key`), kept across reads: the
        # log only merges into records or appends them, so positions hold until a section
        # is replaced whole.
        self._indexes: dict[str, dict[str, int]] = {}
        # The instances whose records the last read changed or added; None when it read
        # state.json whole or replaced the instances whole (anything may have changed).
        self.changed: frozenset[str] | None = None
        self.whole_reads = 0  # state.json read whole (the tests' measure of "read little")

    def read(self) -> RunState | None:
        """The state if it changed since the last read; None if it did not, or there is no
        state.json yet. Raises StateFileError as `read_state` does."""
        try:
            st = os.stat(self.run_dir / STATE_FILE)
        except FileNotFoundError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._state is None or (self._seq is None and stamp != self._snapshot):
            return self._whole(stamp)
        if self._seq is None:
            return None  # a whole state.json, unchanged
        replaced = None if stamp == self._snapshot else _snapshot_seq(self.run_dir / STATE_FILE)
        if stamp != self._snapshot and replaced is None:
            return self._whole(stamp)  # not a snapshot (any more), or it went meanwhile
        new, complete = self._appended()
        if replaced is not None:
            seq = self._seq if new is None else new.seq
            if not complete or seq is None or seq < replaced[1]:
                return self._whole(stamp)  # the snapshot has changes the log did not give
            self._snapshot = replaced[0]
        elif not complete:
            return self._whole(stamp)
        return new

    def unchanged(self) -> bool:
        """Whether a read now would find nothing new: two stats, nothing read (a poller
        that finds the run dir holding still does no more)."""
        try:
            st = os.stat(self.run_dir / STATE_FILE)
        except FileNotFoundError:
            return True
        if self._state is None or (st.st_ino, st.st_mtime_ns, st.st_size) != self._snapshot:
            return False
        if self._seq is None:
            return True
        try:
            log = os.stat(self.run_dir / DELTA_FILE)
        except FileNotFoundError:
            return True  # removed by a compaction (state.json changed) or not begun yet
        return log.st_ino == self._log_ino and log.st_size == self._offset

    def close(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log, self._log_ino, self._offset = None, 0, 0

    def _whole(self, stamp: Stamp) -> RunState:
        # The log is opened before the snapshot is read: its lines appended after are read
        # next time (and skipped there if this reading applied them already).
        self.close()
        self._open_log()
        if self._log is not None:
            self._offset = os.fstat(self._log.fileno()).st_size
        state = read_state(self.run_dir)
        self.whole_reads += 1
        self._snapshot, self._state = stamp, state
        self._seq, self._indexes, self.changed = state.seq, {}, None
        return state

    def _open_log(self) -> None:
        try:
            handle = (self.run_dir / DELTA_FILE).open("rb")
        except OSError:
            return
        self._log, self._log_ino, self._offset = handle, os.fstat(handle.fileno()).st_ino, 0

    def _appended(self) -> tuple[RunState | None, bool]:
        """The state with the log's new lines applied (None: there were none), and whether
        every line read could be applied (False: a gap, a line that is not JSON, a log cut
        back: read state.json whole)."""
        assert self._state is not None and self._seq is not None
        lines: list[bytes] = []
        complete = self._take(lines)
        try:
            replaced = os.stat(self.run_dir / DELTA_FILE).st_ino != self._log_ino
        except OSError:
            replaced = False  # removed (a compaction): the next log is read when it comes
        if complete and replaced:
            # A compaction began a new log: the old one is read to its end (above, through
            # the open file, though removed), then the new one from its start.
            self.close()
            self._open_log()
            complete = self._take(lines)
        if not lines:
            return None, complete
        new, changed = dict(self._state.doc), _Changes()
        copied: set[str] = set()
        seq, applied = self._seq, 0
        for delta in following(seq, lines):
            self._apply(new, delta, copied, changed)
            seq, applied = delta[SEQ], applied + 1
        # Lines the state has already (a log read again after a whole read) are skipped;
        # any other line that was not applied stopped the reading.
        complete = complete and _all_applied(lines, self._seq, seq)
        if seq == self._seq:
            return None, complete
        self._seq, self.changed = seq, changed.frozen()
        self._state = RunState.from_doc(new, self.run_dir / STATE_FILE, seq)
        return self._state, complete

    def _take(self, lines: list[bytes]) -> bool:
        """Add the open log's whole new lines to `lines` (a torn last line waits for its
        end); False if the file was cut back below what was read."""
        if self._log is None:
            return True
        try:
            if os.fstat(self._log.fileno()).st_size < self._offset:
                return False
            self._log.seek(self._offset)
            data = self._log.read()
        except OSError:
            return False
        whole = data[: data.rfind(b"\n") + 1]
        self._offset += len(whole)
        lines.extend(whole.splitlines())
        return True

    def _apply(self, doc: Doc, delta: Doc, copied: set[str], changed: _Changes) -> None:
        """Apply one delta to the copy `doc`: each list section it touches is copied once,
        each record it changes is new, and the instances it changes are named."""
        if apply_one(doc, delta, self._indexes, copied, changed.names):
            changed.whole = True


class _Changes:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.whole = False

    def frozen(self) -> frozenset[str] | None:
        return None if self.whole else frozenset(self.names)


def _all_applied(lines: list[bytes], before: int, after: int) -> bool:
    """The reading did not stop at a gap or at a line that is not JSON: the last line's seq
    (the writer's lines begin with it) is at most `after` (applied, or had before `before`).
    A line that does not begin so counts as not applied (a whole read then decides)."""
    last = lines[-1].strip() if lines else b""
    found = _HEAD.match(last)
    if found is None:
        return not last
    return int(found.group(1)) <= max(before, after)


def _snapshot_seq(path: Path) -> tuple[Stamp, int] | None:
    """state.json's stamp and the seq its tail says, read from one open file (a snapshot
    replaced meanwhile gives the newer one's both); None when it has none."""
    try:
        with path.open("rb") as handle:
            st = os.fstat(handle.fileno())
            handle.seek(max(0, st.st_size - _TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return None
    found = _TAIL.search(tail)
    if found is None:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size), int(found.group(1))
