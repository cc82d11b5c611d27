"""The instances table: live, sortable, filterable, and drawn only where it is on screen.

Rows live in a `viewmodel.RowIndex`, keyed by instance name: a refresh hands over the rows
that changed, each moves to its place in the sort order and the filtered list by bisection,
and the table redraws the 40-odd lines in view. Its cost follows what changed and what is
on screen, not the 80,000 rows of a large job. AGE is drawn from each row's start (and end)
at draw time, so time passing changes no row: a tick repaints just the AGE cells on screen
whose text is not the one drawn there. The cursor follows its instance wherever a
re-sort or a filter moves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.coordinate import Coordinate
from textual.geometry import Region
from textual.message import Message

from srtr.tui import keys
from srtr.tui.viewmodel import (
    COLUMN_KEYS,
    COLUMNS,
    PHASE_COLUMN,
    Filter,
    InstanceRow,
    age_since,
    end_cut,
    middle_cut,
    phase_style,
)
from srtr.tui.viewmodel.table import RowIndex
from srtr.tui.widgets.virtual_table import PAD, Column, VirtualTable

# Columns whose text changes while a row lives get a fixed width, so an update never needs
# the whole column re-measured (and never gets cropped).
FIXED_WIDTH = {"phase": 11, "ready": 5, "restarts": 8, "age": 6, "exit": 11}
AGE_COLUMN = COLUMN_KEYS.index("age")
EXIT_COLUMN = COLUMN_KEYS.index("exit")
NAME_COLUMN = COLUMN_KEYS.index("name")
NAME_WIDTH = 28  # longer names are cut in the middle (the detail pane has them whole)
SERVICE_COLUMN = COLUMN_KEYS.index("service")
SERVICE_WIDTH = 20
MAX_WIDTH = {NAME_COLUMN: NAME_WIDTH, SERVICE_COLUMN: SERVICE_WIDTH}


class _Shown(Mapping[str, InstanceRow]):
    """The rows the filter shows, in table order (a view: nothing is copied)."""

    def __init__(self, index: RowIndex) -> None:
        self._index = index

    def __getitem__(self, name: str) -> InstanceRow:
        if name not in self._index:
            raise KeyError(name)
        return self._index.rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index.names())

    def __len__(self) -> int:
        return len(self._index)


class InstancesTable(VirtualTable):
    """Rows keyed by instance name; the App hands it rows, it posts what is selected."""

    class SelectionChanged(Message):
        """The highlighted instance changed (None: the table is empty)."""

        def __init__(self, name: str | None) -> None:
            super().__init__()
            self.name = name

        def can_replace(self, message: Message) -> bool:
            # Holding a key down scrolls through hundreds of rows: only the last one counts.
            return isinstance(message, InstancesTable.SelectionChanged)

    BINDINGS: ClassVar[list[BindingType]] = keys.TABLE_BINDINGS  # listed by `?`

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._index = RowIndex()
        self._widths = [len(label) for _, label in COLUMNS]
        self._last_selected: str | None = None
        # The AGE text last drawn at each position (a tick repaints the cells it differs
        # from); any other redraw draws whole lines and writes it again.
        self._ages_drawn: dict[int, str] = {}
        self.ages_repainted = 0  # AGE cells repainted alone, by ticks (for tests)
        self.now = 0.0  # the clock of the last frame: AGE is drawn from it

    def on_mount(self) -> None:
        self._set_columns()

    # -- what the App calls -------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._index)

    @property
    def selected(self) -> str | None:
        if not self.row_count:
            return None
        return self._index.name_at(min(self.cursor_row, self.row_count - 1))

    @property
    def shown(self) -> Mapping[str, InstanceRow]:
        return _Shown(self._index)

    @property
    def sort_column(self) -> int | None:
        return self._index.column

    @property
    def sort_reverse(self) -> bool:
        return self._index.reverse

    def apply(
        self,
        rows: Mapping[str, InstanceRow],
        changed: frozenset[str] | None = None,
        now: float | None = None,
        widths: tuple[int, ...] | None = None,
    ) -> None:
        """Show `rows` (all instances, in state order).

        `changed` names the rows that differ from the previous call (None: unknown, or
        another set of instances: start over). A frame's `changed` is relative to the
        previous frame, which is what this table shows, since the App applies every frame
        in order. `widths`: the widest text of each column (`viewmodel.text_widths`), if
        known: else the rows are read for it.
        """
        if now is not None:
            self.now = now
        selected = self.selected
        same = rows is self._index.rows  # the same snapshot again (ages tick): nothing moved
        if same and changed is not None and not changed:
            self._tick_ages()
            return
        # A frame's `changed` implies the same names; a count that differs is a bug's guard.
        if changed is None or (not same and len(rows) != len(self._index.rows)):
            self._index.replace(rows)
            self._fit(widths) if widths else self._fit_widths(rows.values())
        elif changed:
            self._index.update(rows, changed)
            self._fit(widths) if widths else self._fit_widths(rows[name] for name in changed)
        self._settle(selected)

    def set_filter(self, text: str) -> None:
        flt = Filter.parse(text)
        if flt == self._index.filter:
            return
        selected = self.selected or self._last_selected
        self._index.set_filter(flt)
        self._settle(selected)

    def select(self, name: str) -> bool:
        """Move the cursor to `name`; False when the filter hides it."""
        position = self._index.position(name)
        if position is None:
            return False
        self.move_cursor(row=position)
        return True

    def get_column_index(self, key: str) -> int:
        return COLUMN_KEYS.index(key)

    @property
    def cursor_coordinate(self) -> Coordinate:
        return Coordinate(self.cursor_row, self.cursor_column)

    def get_cell_at(self, coordinate: Coordinate) -> Text:
        return self.row_cells(coordinate.row)[coordinate.column]

    # -- sorting ------------------------------------------------------------------------

    def action_sort_next(self) -> None:
        current = -1 if self.sort_column is None else self.sort_column
        nxt = current + 1
        self.sort_by(None if nxt >= len(COLUMNS) else nxt, self.sort_reverse)

    def action_sort_reverse(self) -> None:
        self.sort_by(self.sort_column, not self.sort_reverse)

    def header_clicked(self, column: int) -> None:
        reverse = not self.sort_reverse if column == self.sort_column else False
        self.sort_by(column, reverse)

    def sort_by(self, column: int | None, reverse: bool) -> None:
        selected = self.selected
        self._index.sort(column, reverse)
        self._set_columns()
        self._settle(selected)

    # -- drawing ------------------------------------------------------------------------

    def _age_at(self, position: int) -> str:
        row = self._index.rows[self._index.name_at(position)]
        return "" if row.started is None else age_since(row.started, row.ended or self.now)

    def _tick_ages(self) -> None:
        """Time passed, nothing else: repaint the AGE cells on screen whose text is not
        the one drawn there, and nothing more (no other cell, no other line). A whole
        redraw of the page every second was most of an idle TUI's work."""
        top = round(self.scroll_y)
        left = sum(c.width + 2 * PAD for c in self.columns[:AGE_COLUMN]) - round(self.scroll_x)
        width = self.columns[AGE_COLUMN].width + 2 * PAD if len(self.columns) > AGE_COLUMN else 0
        for position in range(top, min(top + self.page, self.row_count)):
            if self._age_at(position) != self._ages_drawn.get(position):
                self.ages_repainted += 1
                self.refresh(Region(left, position - top + 1, width, 1))

    def row_cells(self, position: int) -> list[Text]:
        row = self._index.rows[self._index.name_at(position)]
        cells = [self._build(i, text) for i, text in enumerate(row.cells)]
        age = self._age_at(position)
        cells[AGE_COLUMN] = Text(age)
        if len(self._ages_drawn) > 4 * self.page:  # rows long scrolled away
            self._ages_drawn.clear()
        self._ages_drawn[position] = age
        return cells

    @staticmethod
    def _build(column: int, text: str) -> Text:
        if column == NAME_COLUMN:
            # A long name must not push PHASE and READY off an 80-column screen.
            return Text(middle_cut(text, NAME_WIDTH))
        if column == SERVICE_COLUMN:
            return Text(end_cut(text, SERVICE_WIDTH))
        if column == PHASE_COLUMN:
            return Text(text, style=phase_style(text))
        if column == EXIT_COLUMN and text and not text.startswith("0"):
            return Text(text, style="red")
        return Text(text)

    # -- internals ----------------------------------------------------------------------

    def _set_columns(self) -> None:
        columns = []
        for index, (key, label) in enumerate(COLUMNS):
            arrow = ""
            if index == self.sort_column:
                arrow = " ▼" if self.sort_reverse else " ▲"
            width = FIXED_WIDTH.get(key) or self._widths[index]
            columns.append(Column(key, Text(label + arrow), max(width, len(label + arrow))))
        self.set_columns(columns)

    def _fit_widths(self, rows: Iterable[InstanceRow]) -> None:
        """Widen the columns whose new cells are wider (they never shrink while a job runs)."""
        widths = [0] * len(COLUMNS)
        for row in rows:
            for index, cell in enumerate(row.cells):
                widths[index] = max(widths[index], len(cell))
        self._fit(tuple(widths))

    def _fit(self, texts: tuple[int, ...]) -> None:
        """Widen the columns whose texts (`texts`, their widest) are wider."""
        widths = list(self._widths)
        for index, width in enumerate(texts):
            if width > widths[index]:
                widths[index] = min(width, MAX_WIDTH.get(index, width))
        if widths != self._widths:
            self._widths = widths
            self._set_columns()

    def _settle(self, selected: str | None) -> None:
        """After a change: the cursor back on `selected` wherever it moved, and the App
        told when what is under the cursor is another instance."""
        position = None if selected is None else self._index.position(selected)
        if position is not None:
            self.cursor_row = position
        self.reshape()
        self._scroll_to_cursor()
        self.cursor_moved()

    def cursor_moved(self) -> None:
        name = self.selected
        if name is not None and name != self._last_selected:
            self._last_selected = name
            self.post_message(self.SelectionChanged(name))
