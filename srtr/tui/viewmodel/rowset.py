"""The instances table's rows of one snapshot, built when first asked for.

A row costs some 20 µs to build: 80,000 of them are the better part of two seconds, which a
first frame cannot wait for. `Rows` maps each instance's name to its row but builds a row
only when it is read (the 40-odd on screen for the first frame); the reading thread then
builds the rest (`warm`) while the screen is up, for a sort or a filter that reads them all.
A later snapshot's `Rows` keeps every row whose instance did not change.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.rows import COLUMN_KEYS, SORT_KEYS, InstanceRow, instance_row

# The columns whose width follows their text (the others have a fixed width, see
# `widgets.instances_table`), and the instance field each shows.
_WIDTH_FIELDS = {
    "name": "name",
    "node": "node",
    "ip": "node_ip",
    "service": "service",
    "kind": "kind",
}


class Rows(Mapping[str, InstanceRow]):
    """Rows by instance name, in state order, each built on first read and kept.

    The rows of successive snapshots share one cache: a row stays while its instance's
    document is the same (the very object, as the state follower's copies share unchanged
    records, or an equal one). `every()` gives them all as a plain dict, for the loops of a
    sort or a filter.
    """

    def __init__(
        self,
        docs: Mapping[str, Doc],
        now: float,
        cache: dict[str, tuple[Doc, InstanceRow]] | None = None,
        valid: dict[str, InstanceRow] | None = None,
    ) -> None:
        self._docs = docs
        self._now = now
        # Filled from the reading thread and the UI's: a row built twice is the same row.
        self._cache: dict[str, tuple[Doc, InstanceRow]] = {} if cache is None else cache
        self._valid: dict[str, InstanceRow] = {} if valid is None else valid  # this snapshot's

    def __getitem__(self, name: str) -> InstanceRow:
        row = self._valid.get(name)
        if row is not None:
            return row
        doc = self._docs[name]
        kept = self._cache.get(name)
        if kept is not None and (kept[0] is doc or kept[0] == doc):
            row = kept[1]
        else:
            row = instance_row(doc, self._now)
            self._cache[name] = (doc, row)
        self._valid[name] = row
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self._docs)

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, name: object) -> bool:
        return name in self._docs

    @property
    def warmed(self) -> bool:
        """Every row is built."""
        return len(self._valid) >= len(self._docs)

    def warm(self) -> None:
        """Build every row not built yet (at once when all are: a poll asks every 0.25 s)."""
        if self.warmed:
            return
        for name in self._docs:
            if name not in self._valid:
                self[name]

    def every(self) -> dict[str, InstanceRow]:
        """Every row (in no particular order): a plain dict, for a loop over them all."""
        self.warm()
        return self._valid

    def sort_values(self, column: int) -> list[Any]:
        """Every row's value in `column`, in state order, read from the documents: a sort
        keystroke on 80,000 rows not built yet costs a tenth of a second, not two."""
        if self.warmed:
            valid = self._valid
            return [valid[name].sort[column] for name in self._docs]
        key = SORT_KEYS[column]
        return [key(doc) for doc in self._docs.values()]

    def updated(self, docs: Mapping[str, Doc], changed: Iterable[str], now: float) -> Rows:
        """The rows of `docs`, which differ from this one's only in `changed`."""
        valid = dict(self._valid)
        for name in changed:
            valid.pop(name, None)
        return Rows(docs, now, self._cache, valid)


def text_widths(docs: Collection[Doc], widths: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The widest text of each column whose width follows its text, over `docs` (and
    `widths`, those of earlier rows), in COLUMNS order (0 for the other columns): read from
    the documents, so that no row is built for it."""
    out = list(widths or (0,) * len(COLUMN_KEYS))
    fields = [(COLUMN_KEYS.index(key), field) for key, field in _WIDTH_FIELDS.items()]
    for index, field in fields:
        longest = max((len(str(doc.get(field, ""))) for doc in docs), default=0)
        out[index] = max(out[index], longest)
    return tuple(out)
