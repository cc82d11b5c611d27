"""Following a run dir's state from a reader that polls often (the TUI).

`rundir.read_state` reads state.json and the whole delta log each time: right for a verb that
reads once, too much for a reader that polls a big job every second (a 60 MB snapshot parsed
again for each line the controller appends). `StateFollower` reads state.json whole only when
it was replaced (a small job's every write, a big job's compaction) and otherwise only the
delta log's lines appended since its last read, applied to a copy that shares unchanged
records with the previous document. It says which instances those lines changed
(`changed`), so that a view of 80,000 rows redraws the few that did.

A replaced snapshot is read by `rundir.read_state` (orjson, the garbage collector paused),
and new lines are taken by `state_delta.following`, as every reader takes them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from srtr.store.rundir import STATE_FILE, RunState, read_state
from srtr.store.state_delta import DELTA_FILE, SEQ, apply_one, following

Stamp = tuple[int, int, int]
Doc = dict[str, Any]


class StateFollower:
    """The state of one run dir, read again only where it changed."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._snapshot: Stamp | None = None  # state.json as last read (inode, mtime, size)
        self._state: RunState | None = None
        self._seq: int | None = None  # a snapshot's last change applied (None: a whole file)
        self._offset = 0  # the delta log's bytes applied
        # Where each record of a list section sits (by `item_key`), kept across reads: the
        # log only merges into records or appends them, so positions hold until a section
        # is replaced whole.
        self._indexes: dict[str, dict[str, int]] = {}
        # The instances whose records the last read changed or added; None when it read
        # state.json whole or replaced the instances whole (anything may have changed).
        self.changed: frozenset[str] | None = None

    def read(self) -> RunState | None:
        """The state if it changed since the last read; None if it did not, or there is no
        state.json yet. Raises StateFileError as `read_state` does."""
        try:
            st = os.stat(self.run_dir / STATE_FILE)
        except FileNotFoundError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._state is None or stamp != self._snapshot:
            return self._whole(stamp)
        if self._seq is None:
            return None  # a whole state.json, unchanged
        return self._appended()

    def unchanged(self) -> bool:
        """Whether a read now would find nothing new: two stats, nothing read (a poller
        that finds the run dir holding still does no more)."""
        try:
            st = os.stat(self.run_dir / STATE_FILE)
        except FileNotFoundError:
            return True
        if self._state is None or (st.st_ino, st.st_mtime_ns, st.st_size) != self._snapshot:
            return False
        return self._seq is None or _size(self.run_dir / DELTA_FILE) == self._offset

    def _whole(self, stamp: Stamp) -> RunState:
        # The log's size before the snapshot is read: lines appended after are read next
        # time (and skipped there if this reading applied them already).
        offset = _size(self.run_dir / DELTA_FILE)
        state = read_state(self.run_dir)
        self._snapshot, self._state, self._offset = stamp, state, offset
        self._seq, self._indexes, self.changed = state.seq, {}, None
        return state

    def _appended(self) -> RunState | None:
        assert self._state is not None and self._seq is not None
        path = self.run_dir / DELTA_FILE
        if _size(path) < self._offset:  # the log began again: read everything again
            self._snapshot = None
            return self.read()
        data = _read_from(path, self._offset)
        whole = data[: data.rfind(b"\n") + 1]  # a torn last line waits for its end
        if not whole:
            return None
        self._offset += len(whole)
        new, changed = dict(self._state.doc), _Changes()
        copied: set[str] = set()
        seq = self._seq
        for delta in following(seq, whole.splitlines()):
            self._apply(new, delta, copied, changed)
            seq = delta[SEQ]
        if seq == self._seq:
            return None
        self._seq, self.changed = seq, changed.frozen()
        self._state = RunState.from_doc(new, self.run_dir / STATE_FILE, seq)
        return self._state

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


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except OSError:
        return b""
