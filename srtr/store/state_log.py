"""The state writer: state.json whole while it is small, snapshot + delta log once it is big.

docs/design/state-store.md says why. A job whose state.json is at most `SNAPSHOT_LIMIT`
gets it rewritten whole (atomically) on every write, exactly as ever. Beyond that size a
write appends one line to state.delta.jsonl (`state_delta` has its format) with the
records of the instances the store's transitions touched and the other sections that
differ from the last write. summary.json (small: what `srtr status` prints) is replaced
`SUMMARY_PERIOD` after a change, if it still differs then: a restart that is over by then
costs it nothing. state.json is rewritten (with the change it includes, `seq`) only to
compact: when the next line would make the log outgrow it, after a live edit changed the
set of instances, after a write failed, and at the job's end. Every instance record is
serialized when it changes and kept, so a compaction joins kept texts instead of
serializing the whole job again.

While the job tears down, the instance records wait (their touches are kept) for the last
write, or for `TEARDOWN_PERIOD`: every instance changes twice in a teardown (Terminating,
then its exit), and each pass over 80,000 records costs seconds of the loop.

The guard's mirror (`Mirror`) gets the same: the snapshot, then each delta line appended.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson

from srtr.store.persist import AppendFile, WallClock, instance_record, write_atomic
from srtr.store.rundir import STATE_FILE
from srtr.store.state_delta import (
    DELTA_FILE,
    ITEM_SECTIONS,
    SEQ,
    SNAPSHOT_LIMIT,
    SUMMARY_FILE,
    item_key,
)
from srtr.store.state_summary import Counts, summary_doc
from srtr.store.store import Store

# The delta log is fsynced at most this often, at a write (a host crash loses at most that).
SYNC_PERIOD = 300.0
# summary.json is replaced this long after a change, with what is true then.
SUMMARY_PERIOD = 2.0
# A teardown writes the instance records at most this often before its last write.
TEARDOWN_PERIOD = 20.0


# What differs from the last write: sections set whole, object fields, list records.
Changes = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


class Mirror(Protocol):
    """A copy of what the writer writes (the guard's memory file)."""

    def write(self, text: str) -> None: ...

    def append(self, text: str) -> None: ...


def _dumps(value: Any) -> str:
    """Compact JSON: orjson's, ~5x the stdlib's speed on a big job's 80,000 records (the last
    write of its teardown serializes them all)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def compose(head: dict[str, Any], instances: list[str], seq: int | None = None) -> str:
    """The state.json text of `head` with the instance records `instances` (JSON texts) in
    its `instances` place: the same bytes as dumping the whole document compactly."""
    parts = []
    for key, value in head.items():
        text = "[" + ",".join(instances) + "]" if key == "instances" else _dumps(value)
        parts.append(f"{_dumps(key)}:{text}")
    if seq is not None:
        parts.append(f'"{SEQ}":{seq}')
    return "{" + ",".join(parts) + "}\n"


class StateWriter:
    """Writes a run dir's state (state.json, and for a big job the delta log and summary)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        limit: int = SNAPSHOT_LIMIT,
        sync_period: float = SYNC_PERIOD,
        summary_period: float = SUMMARY_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        restore: Callable[[], bool] = lambda: False,
    ) -> None:
        self.run_dir = run_dir
        self.limit, self.clock = limit, clock
        self.sync_period, self.summary_period = sync_period, summary_period
        self.log = AppendFile(run_dir / DELTA_FILE, restore)
        self.seq = 0
        self.large = False  # state.json is a snapshot with a delta log
        self.texts: dict[str, str] = {}  # instance name -> its record's JSON (big jobs)
        self.sections: dict[str, Any] = {}  # head section -> its value as last written
        self.counts = Counts()
        self.hosts: dict[str, str] = {}  # pool -> its node list as a host list
        self._pool_nodes: dict[str, list[str]] = {}
        self._shape: tuple[int, int] | None = None
        self._compact = True  # the next big write rewrites the snapshot
        self._snapshot_bytes = 0
        self._log_bytes = 0
        self._synced_at = 0.0
        self._summary_key = ""  # summary.json as last written, but its seq
        self._summary_due: float | None = None  # when a changed summary is to be written
        self._deferred: set[str] = set()  # touched instances a teardown has not written yet
        self._deferred_at: float | None = None
        self._first = True
        self._final = False
        self.mirror: Mirror | None = None
        self.mirrored: list[str] = []  # the snapshot and the lines since: a new mirror's copy
        self.written = 0  # bytes written to the run dir by the last write
        self.compacted = False  # the last write rewrote a big job's snapshot

    def attach(self, mirror: Mirror) -> None:
        """Copy every write to `mirror` too, starting with the current state."""
        self.mirror = mirror
        if self.mirrored:
            mirror.write("".join(self.mirrored))
        self.mirrored = []

    def finish(self) -> None:
        """The next write is the job's last: a big job's snapshot is rewritten (from the
        kept records), so that state.json is whole and current once the job is over."""
        self._final = True

    def invalidate(self) -> None:
        """The next write rewrites everything (the run dir was recreated, a write failed)."""
        self._compact = True

    def due_in(self) -> float | None:
        """Seconds until a write is due with nothing else changing (a summary.json that
        waits for its period), or None: the writer's caller writes then."""
        if self._summary_due is None:
            return None
        return max(0.0, self._summary_due - self.clock())

    def write(self, head: dict[str, Any], store: Store) -> None:
        """Write the store's state (`head`: its sections but the instances, `persist.head`).
        Raises OSError with the files as they were (and the next write compacts)."""
        touched = self._deferred | store.take_touched()
        self._deferred = set()
        self.compacted = False
        shape = (store.job.generation, len(store.specs))
        try:
            if self._first:
                self._remove_stale()
            if not self.large or shape != self._shape:
                self._whole(head, store, shape)
            elif self._compact:  # from the kept records: a retry costs O(change) too
                self._refresh(store, touched)
                self._snapshot(head)
            else:
                self._delta(head, store, self._defer(store, touched))
        except OSError:
            self._compact = True  # what it held is in memory: all of it goes next time
            raise

    def _defer(self, store: Store, touched: set[str]) -> set[str]:
        """The touched instances to write now: none while a teardown's records wait."""
        if not store.job.teardown_requested or self._final:
            return touched
        now = self.clock()
        if self._deferred_at is None:
            self._deferred_at = now
        if now - self._deferred_at >= TEARDOWN_PERIOD:
            self._deferred_at = now
            return touched
        self._deferred = touched
        return set()

    # -- whole writes -------------------------------------------------------------------------
    def _whole(self, head: dict[str, Any], store: Store, shape: tuple[int, int]) -> None:
        """Every record serialized again (a small job's every write; a big job's after a
        live edit changed its instances), then state.json: whole, or a snapshot."""
        wall = WallClock(store)
        records = [instance_record(store, name, wall) for name in store.specs]
        self.texts = {name: _dumps(r) for name, r in zip(store.specs, records, strict=True)}
        self.counts.rebuild(list(records))
        self._shape = shape
        self._snapshot(head)

    def _become_small(self, text: str) -> None:
        if self.large:
            self.large = False
            self._remove_stale()
        self._copy(text, whole=True)

    def _snapshot(self, head: dict[str, Any], *, folded: bool = False) -> None:
        """state.json from the kept records: whole while it is small; else (a compaction)
        the snapshot, then a new (empty) delta log. `folded`: the log's last line holds
        every change the snapshot has (it takes that line's seq, not a new one)."""
        self.sections = {k: v for k, v in head.items() if k != "instances"}
        texts = list(self.texts.values())
        if sum(map(len, texts)) < self.limit:  # small: state.json whole, as ever
            text = compose(head, texts)
            if len(text) <= self.limit:
                write_atomic(self.run_dir / STATE_FILE, text)
                self.written = len(text)
                self._become_small(text)
                return
        self.seq += 0 if folded else 1
        text = compose(head, texts, self.seq)
        write_atomic(self.run_dir / STATE_FILE, text)
        self.large = self.compacted = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.run_dir / DELTA_FILE)  # after: its lines are in the snapshot
        self._compact = False
        self._snapshot_bytes, self._log_bytes = len(text), 0
        self._synced_at = self.clock()  # write_atomic synced what the log held
        self.written = len(text) + self._summary(head, now=True)
        self._copy(text, whole=True)

    # -- deltas -------------------------------------------------------------------------------
    def _refresh(self, store: Store, touched: set[str]) -> list[str]:
        """Serialize the touched instances' records again; return those that changed."""
        wall = WallClock(store)
        changed: list[str] = []
        for name in touched:
            if name not in store.specs:
                continue
            record = instance_record(store, name, wall)
            text = _dumps(record)
            if self.texts.get(name) != text:
                self.texts[name] = text
                changed.append(text)
                self.counts.update(record)
        return changed

    def _delta(self, head: dict[str, Any], store: Store, touched: set[str]) -> None:
        changed = self._refresh(store, touched)
        sections = self._changed_sections(head)
        if self._final and (changed or any(sections) or self._log_bytes):
            self._snapshot(head)  # the last write: state.json whole and current
            return
        if not changed and not any(sections):
            self.written = self._summary(head, now=self._final)  # one that waited, if due
            return
        line = self._line(changed, *sections)
        self.seq += 1
        line = f'{{"{SEQ}":{self.seq},' + line[1:]
        data = line.encode("utf-8")
        try:
            self.log.write(data)
        except OSError:
            self.seq -= 1
            raise
        self._log_bytes += len(data)
        self._copy(line, whole=False)
        # The log outgrows the snapshot by this line at most (a reader reads at most twice a
        # document); a teardown's lines may, as its last write compacts anyway. The line is
        # written first and the snapshot includes no more than it (the same seq), so that a
        # reader that holds the log open and read this line has the snapshot's state without
        # reading it (`state_follow`).
        if self._log_bytes > self._snapshot_bytes and self._deferred_at is None:
            self._snapshot(head, folded=True)
            self.written += len(data)
            return
        self.written = len(data) + self._summary(head, now=False)
        if self.clock() - self._synced_at >= self.sync_period:
            self._synced_at = self.clock()
            self.log.sync()  # a failure: the next write compacts (and write_atomic syncs)

    @staticmethod
    def _line(
        changed: list[str], sets: dict[str, Any], fields: dict[str, Any], items: dict[str, Any]
    ) -> str:
        """A delta line but its `seq` (which goes first)."""
        parts = []
        if sets:
            parts.append(f'"set":{_dumps(sets)}')
        if fields:
            parts.append(f'"fields":{_dumps(fields)}')
        listed = [f"{_dumps(k)}:{_dumps(v)}" for k, v in items.items()]
        if changed:
            listed.append('"instances":[' + ",".join(changed) + "]")
        if listed:
            parts.append('"items":{' + ",".join(listed) + "}")
        return "{" + ",".join(parts) + "}\n"

    def _changed_sections(self, head: dict[str, Any]) -> Changes:
        """(sections to replace whole, object sections' fields that changed, list sections'
        records that changed: their key and the fields that differ)."""
        sets: dict[str, Any] = {}
        fields: dict[str, Any] = {}
        items: dict[str, Any] = {}
        for key, value in head.items():
            if key == "instances":
                continue
            old = self.sections.get(key)
            if old == value:
                continue
            self.sections[key] = value
            if key in ITEM_SECTIONS and (diff := _item_diff(old, value)) is not None:
                items[key] = diff
            elif isinstance(old, dict) and isinstance(value, dict) and not old.keys() - value:
                fields[key] = {k: v for k, v in value.items() if old.get(k, _MISSING) != v}
            else:
                sets[key] = value
        return sets, fields, items

    # -- summary, mirror, leftovers -----------------------------------------------------------
    def _summary(self, head: dict[str, Any], *, now: bool) -> int:
        """Replace summary.json if it differs from the last one (its seq aside): `now`, or
        once `summary_period` has passed since the first write that found it changed (a
        new file is a new page written; a change undone by then costs nothing). Returns
        the bytes written."""
        for pool in head.get("pools", []):
            name, nodes = str(pool.get("name")), pool.get("nodes", [])
            if self._pool_nodes.get(name) != nodes:  # compressed again only when it changed
                self._pool_nodes[name], self.hosts[name] = nodes, _hostlist(nodes)
        doc = summary_doc(self.seq, head, self.counts, self.hosts)
        seq = doc.pop("seq")
        key = _dumps(doc)
        if key == self._summary_key:
            self._summary_due = None
            return 0
        if not now and self.summary_period > 0:
            if self._summary_due is None:
                self._summary_due = self.clock() + self.summary_period
            if self.clock() < self._summary_due:
                return 0
        text = f'{{"seq":{seq},{key[1:]}\n'
        _replace(self.run_dir / SUMMARY_FILE, text)
        self._summary_key, self._summary_due = key, None
        return len(text)

    def _copy(self, text: str, *, whole: bool) -> None:
        if self.mirror is None:  # kept for a mirror that attaches later, and only until then
            self.mirrored = [text] if whole else [*self.mirrored, text]
        elif whole:
            self.mirror.write(text)
        else:
            self.mirror.append(text)

    def _remove_stale(self) -> None:
        """No delta log or summary of an earlier big write (or job) outlives a whole
        state.json: readers would take them for this one's."""
        self._first = False
        self._summary_key, self._summary_due = "", None
        for name in (DELTA_FILE, SUMMARY_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.run_dir / name)

    def close(self) -> None:
        self.log.close()


def _item_diff(old: object, new: object) -> list[dict[str, Any]] | None:
    """The records of list section `new` that differ from `old`, each as its key and the
    fields that changed; None when the records themselves differ (added, removed, moved)."""
    if not isinstance(old, list) or not isinstance(new, list) or len(old) != len(new):
        return None
    out: list[dict[str, Any]] = []
    for before, after in zip(old, new, strict=True):
        if before == after:
            continue
        if not isinstance(before, dict) or not isinstance(after, dict):
            return None
        if item_key(before) != item_key(after) or not item_key(after) or before.keys() - after:
            return None
        key = "name" if after.get("name") else "url"
        fields = {k: v for k, v in after.items() if before.get(k, _MISSING) != v}
        out.append({key: after[key], **fields})
    return out


_MISSING = object()


def _hostlist(nodes: list[str]) -> str:
    import hostlist

    return str(hostlist.collect_hostlist(nodes)) if nodes else ""


def _replace(path: Path, text: str) -> None:
    """Write `path` by rename (whole or not at all); no fsync: summary.json is derived."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
