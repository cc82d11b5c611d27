"""The delta log of a big job's state: its line format, and how a reader applies it.

A job whose state.json outgrows `SNAPSHOT_LIMIT` no longer rewrites it per change
(docs/design/state-store.md): state.json becomes a snapshot that says which change it
includes (`seq`), and each later write appends one line to state.delta.jsonl:

    {"seq": 8, "set": {"exporters": [...]}, "fields": {"job": {"cause": {...}}},
     "items": {"instances": [{...}], "pools": [{...}]}}

`set` replaces whole sections; `fields` replaces the fields it names of an object section
(the job's cause, not the 2 KB job: every line of a restart would carry it); `items`
merges records of list sections into the record with the same key (`item_key`: an
instance's or pool's name), field by field, or appends a record that is new.
`apply_deltas` is how every reader (`rundir.read_state`, the guard's mirror) turns a
snapshot and its log into the current document. Pure: no files here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

DELTA_FILE = "state.delta.jsonl"
SUMMARY_FILE = "summary.json"
SEQ = "seq"  # the snapshot's key: the last change it includes (absent: no delta log)
# state.json is rewritten whole while its document is at most this big; beyond, changes go
# to the delta log and state.json is rewritten only when the log is compacted.
SNAPSHOT_LIMIT = 1 << 20
# The list sections whose records a delta merges by key (the others are replaced whole).
ITEM_SECTIONS = ("nodes", "pools", "instances", "exporters")


def item_key(item: dict[str, Any]) -> str:
    """What identifies a record of a list section: its name (an exporter row's URL when
    it has no name yet)."""
    return str(item.get("name") or item.get("url") or "")


def snapshot_seq(doc: dict[str, Any]) -> int | None:
    """The change a snapshot includes; None for a whole state.json (no delta log to read).
    Removes the key: readers see the document with the fields it always had."""
    seq = doc.pop(SEQ, None)
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def apply_deltas(doc: dict[str, Any], seq: int, lines: Iterable[str | bytes]) -> int:
    """Apply the log's lines that follow change `seq` to `doc` in place; return the last
    change applied (see `following` for which lines apply)."""
    indexes: dict[str, dict[str, int]] = {}
    for delta in following(seq, lines):
        apply_one(doc, delta, indexes)
        seq = delta[SEQ]
    return seq


def following(seq: int, lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The deltas among `lines` that follow change `seq`, in order.

    Lines the snapshot includes already (a log older than a compaction) are skipped. A line
    that is not whole JSON (a write cut short, the log's torn last line) ends the reading, and
    so does a gap in the sequence (a log restarted after a newer snapshot than the reader's):
    the result is always the state as of one change, never a mix.
    """
    for line in lines:
        if not line.strip():
            continue
        try:
            delta = orjson.loads(line)
        except ValueError:
            return
        if not isinstance(delta, dict) or not isinstance(delta.get(SEQ), int):
            return
        if delta[SEQ] <= seq:
            continue
        if delta[SEQ] != seq + 1:
            return
        yield delta
        seq = delta[SEQ]


def apply_one(
    doc: dict[str, Any],
    delta: dict[str, Any],
    indexes: dict[str, dict[str, int]],
    copied: set[str] | None = None,
    changed: set[str] | None = None,
) -> bool:
    """Apply one delta to `doc`: in place, or (`copied`: the sections this copy owns
    already) copying each list section it touches once and each record it changes. The
    names of the instances it changes go to `changed`; True: it replaced them all."""
    whole = False
    sets = delta.get("set")
    if isinstance(sets, dict):
        for section, value in sets.items():
            doc[section] = value
            indexes.pop(section, None)  # a list replaced whole: its index is stale
            whole = whole or section == "instances"
            if copied is not None:
                copied.add(section)  # a new list: the copy's own
    fields = delta.get("fields")
    if isinstance(fields, dict):
        for section, named in fields.items():
            old = doc.get(section)
            if isinstance(old, dict) and isinstance(named, dict):
                doc[section] = {**old, **named}  # a new object: a copy shares the old one
    items = delta.get("items")
    if not isinstance(items, dict):
        return whole
    for section, records in items.items():
        if copied is not None and section not in copied:
            doc[section] = list(doc.get(section, []))
            copied.add(section)
        current = doc.setdefault(section, [])
        index = indexes.get(section)
        if index is None:
            index = indexes[section] = {item_key(r): i for i, r in enumerate(current)}
        for record in records:
            key = item_key(record)
            at = index.get(key)
            if at is None:
                index[key] = len(current)
                current.append(record)
            elif copied is None:
                current[at].update(record)
            else:
                current[at] = {**current[at], **record}
            if changed is not None and section == "instances":
                changed.add(key)
    return whole


def applied_copy(
    doc: dict[str, Any], seq: int, lines: Iterable[str | bytes]
) -> tuple[dict[str, Any], int]:
    """`apply_deltas` on a copy of `doc`: the new document shares every record no line
    changed with `doc` and has new ones for those that changed (a reader that keeps the
    previous document tells what changed by comparing the two). Returns it and the last
    change applied."""
    out = dict(doc)
    copied: set[str] = set()
    indexes: dict[str, dict[str, int]] = {}
    for delta in following(seq, lines):
        apply_one(out, delta, indexes, copied)
        seq = delta[SEQ]
    return out, seq
