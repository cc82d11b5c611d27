"""Following a run dir's state from a reader that polls often (the TUI).

`rundir.read_state` reads state.json and the whole delta log each time: right for a verb that
reads once, too much for a reader that polls a big job every second (a 60 MB snapshot parsed
again for each line the controller appends). `StateFollower` reads state.json whole only when
it was replaced (a small job's every write, a big job's compaction) and otherwise only the
delta log's lines appended since its last read, applied to a copy that shares unchanged
records with the previous document.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from srtr.store.rundir import STATE_FILE, RunState, read_state
from srtr.store.state_delta import DELTA_FILE, applied_copy

Stamp = tuple[int, int, int]


class StateFollower:
    """The state of one run dir, read again only where it changed."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._snapshot: Stamp | None = None  # state.json as last read (inode, mtime, size)
        self._state: RunState | None = None
        self._seq: int | None = None  # a snapshot's last change applied (None: a whole file)
        self._offset = 0  # the delta log's bytes applied

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

    def _whole(self, stamp: Stamp) -> RunState:
        # The log's size before the snapshot is read: lines appended after are read next
        # time (and skipped there if this reading applied them already).
        offset = _size(self.run_dir / DELTA_FILE)
        state = read_state(self.run_dir)
        self._snapshot, self._state, self._offset = stamp, state, offset
        self._seq = state.seq
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
        doc = cast(dict[str, Any], self._state.doc)
        new, seq = applied_copy(doc, self._seq, whole.splitlines())
        if seq == self._seq:
            return None
        self._seq = seq
        self._state = RunState.from_doc(new, self.run_dir / STATE_FILE, seq)
        return self._state


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
