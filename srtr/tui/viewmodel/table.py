"""The instances table's order and filter, kept up to date one changed row at a time.

With 80,000 instances a refresh cannot sort, filter or even walk every row: `RowIndex` keeps
the rows in sort order (a sorted list of `(sort value, state index, name)` entries) and the
rows the filter lets through in the same order, and a changed row moves by two bisections.
Only a new sort column or a new filter walks them all, once, on that keystroke.

Order: ascending by the sort column's value, equal values in state order; reversed, the
whole of that list backwards. Without a sort column: state order (or its reverse).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from typing import Any

from srtr.tui.viewmodel.rows import Filter, InstanceRow
from srtr.tui.viewmodel.rowset import Rows

Entry = tuple[Any, int, str]  # (sort value, state index, name)


class RowIndex:
    """Rows by instance name, their order under a sort column and the subset a filter shows."""

    def __init__(self) -> None:
        self.rows: Mapping[str, InstanceRow] = {}
        self.column: int | None = None
        self.reverse = False
        self.filter = Filter()
        self._seq: dict[str, int] = {}  # state index of each row
        self._entry: dict[str, Entry] = {}
        self._sorted: list[Entry] = []
        self._visible: list[Entry] = []

    # -- what changes it ------------------------------------------------------------------

    def replace(self, rows: Mapping[str, InstanceRow]) -> None:
        """Start over with `rows` (in state order): a new instance set."""
        self.rows = rows  # never changed here
        self._seq = {name: i for i, name in enumerate(self.rows)}
        self._resort()

    def update(self, rows: Mapping[str, InstanceRow], changed: Iterable[str]) -> None:
        """`rows` differ from the current ones only in `changed` (same names, same order)."""
        self.rows = rows
        visible = self._visible
        for name in changed:
            old = self._entry[name]
            new = self._make(name)
            moved = new != old  # never, in state order: a row keeps its place
            if moved:
                _remove(self._sorted, old)
                insort(self._sorted, new)
                self._entry[name] = new
            # (Without a filter the row itself is not read: it is built when drawn.)
            shown = not self.filter or self.filter.matches(self.rows[name])
            at = bisect_left(visible, old)
            was = at < len(visible) and visible[at] == old
            if was and shown and not moved:
                continue  # thousands of rows change at once: no list is moved for these
            if was:
                del visible[at]
            if shown:
                insort(visible, new)

    def sort(self, column: int | None, reverse: bool) -> None:
        if column != self.column:
            self.column = column
            self._resort()
        self.reverse = reverse

    def set_filter(self, flt: Filter) -> None:
        if flt != self.filter:
            self.filter = flt
            self._refilter()

    # -- what it shows --------------------------------------------------------------------

    def __len__(self) -> int:
        """Rows the filter shows."""
        return len(self._visible)

    def name_at(self, position: int) -> str:
        """The name shown at `position` (0: the top row)."""
        if self.reverse:
            position = len(self._visible) - 1 - position
        return self._visible[position][2]

    def names(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The names shown from `start` to `stop`, top to bottom."""
        stop = len(self._visible) if stop is None else min(stop, len(self._visible))
        return [self.name_at(i) for i in range(max(0, start), stop)]

    def position(self, name: str) -> int | None:
        """Where `name` is shown, or None when the filter hides it (or it does not exist)."""
        entry = self._entry.get(name)
        if entry is None:
            return None
        at = bisect_left(self._visible, entry)
        if at >= len(self._visible) or self._visible[at] != entry:
            return None
        return len(self._visible) - 1 - at if self.reverse else at

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.position(name) is not None

    # -- internals ------------------------------------------------------------------------

    def _make(self, name: str, rows: Mapping[str, InstanceRow] | None = None) -> Entry:
        value = None if self.column is None else (rows or self.rows)[name].sort[self.column]
        return (value, self._seq[name], name)

    def _resort(self) -> None:
        # The sort keystroke of 80,000 rows: every entry made by loops that run in C (no
        # call of `_make` per row), the values read in one comprehension.
        names = list(self.rows)
        column = self.column
        values: list[Any]
        if column is None:
            values = [None] * len(names)
        elif isinstance(self.rows, Rows):
            values = self.rows.sort_values(column)  # no row built for it
        else:
            values = [self.rows[name].sort[column] for name in names]
        entries = list(zip(values, map(self._seq.__getitem__, names), names, strict=True))
        self._entry = dict(zip(names, entries, strict=True))
        # Without a sort column the entries are in state order already. With one: a stable
        # sort by the values alone is the entries' order (equal values stay in state
        # order), and it never compares two entries' state indexes: thousands of rows
        # share a phase or a service.
        if column is not None:
            entries = [entries[i] for i in sorted(range(len(values)), key=values.__getitem__)]
        self._sorted = entries
        self._refilter()

    def _refilter(self) -> None:
        flt = self.filter
        rows = _every(self.rows) if flt else self.rows
        if not flt:
            self._visible = list(self._sorted)
        else:
            self._visible = [e for e in self._sorted if flt.matches(rows[e[2]])]


def _remove(entries: list[Entry], entry: Entry) -> None:
    at = bisect_left(entries, entry)
    if at < len(entries) and entries[at] == entry:
        del entries[at]


def _every(rows: Mapping[str, InstanceRow]) -> Mapping[str, InstanceRow]:
    """`rows` as a plain dict when they are built on demand (`Rows`): a loop over all of
    them then costs a dict's lookups, not a method call each."""
    return rows.every() if isinstance(rows, Rows) else rows
