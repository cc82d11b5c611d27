"""The instances table: live, sortable, filterable, and updated cell by cell.

A refresh never clears the table: rows are diffed by instance name (`viewmodel.diff_rows`)
and only changed cells are written, so the selection and the scroll position survive and
a 4,096-row table costs what changed, not what exists. Only a new filter, or a diff that
touches many rows at once, rebuilds the table (DataTable's `remove_row` is linear, so
removing thousands of rows one by one would be slower than starting over).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from srtr.tui import keys
from srtr.tui.viewmodel import (
    COLUMN_KEYS,
    COLUMNS,
    PHASE_COLUMN,
    Filter,
    InstanceRow,
    diff_rows,
    end_cut,
    filtered,
    middle_cut,
    phase_style,
    sort_changed,
)

# Columns whose text changes while a row lives get a fixed width, so an update never needs
# the whole column re-measured (and never gets cropped).
FIXED_WIDTH = {"phase": 11, "ready": 5, "restarts": 8, "age": 6, "exit": 11}
REBUILD_AT = 64  # rows added or removed in one diff beyond which a rebuild is cheaper
EXIT_COLUMN = COLUMN_KEYS.index("exit")
NAME_COLUMN = COLUMN_KEYS.index("name")
NAME_WIDTH = 28  # longer names are cut in the middle (the detail pane has them whole)
SERVICE_COLUMN = COLUMN_KEYS.index("service")
SERVICE_WIDTH = 20


class InstancesTable(DataTable[Any]):
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
        self._all: dict[str, InstanceRow] = {}
        self._shown: dict[str, InstanceRow] = {}
        self._index: dict[str, int] = {}
        self._filter = Filter()
        self.sort_column: int | None = None
        self.sort_reverse = False
        self._last_selected: str | None = None

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key, width=FIXED_WIDTH.get(key))

    # -- what the App calls -------------------------------------------------------------

    @property
    def selected(self) -> str | None:
        if not self.row_count:
            return None
        row_key = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key
        return row_key.value

    @property
    def shown(self) -> Mapping[str, InstanceRow]:
        return self._shown

    def apply(self, rows: dict[str, InstanceRow], changed: frozenset[str] | None = None) -> None:
        """Show `rows` (all instances, in state order), changing only what differs.

        `changed` names the rows that differ from the previous call (None: unknown, so
        every row is compared). A frame's `changed` is relative to the previous frame, which
        is what this table shows, since the App applies every frame in order.
        """
        if changed is None or len(rows) != len(self._all) or not self._shown:
            self._apply_all(rows)
            return
        self._all = rows
        selected = self.selected
        resort = False
        for key in changed:
            row = rows[key]
            shown = self._shown.get(key)
            match = self._filter.matches(row)
            if shown is not None and match:
                for column, (old, new) in enumerate(zip(shown.cells, row.cells, strict=True)):
                    if old != new:
                        self.update_cell(key, COLUMN_KEYS[column], self._build(column, new))
                        resort = resort or column == self.sort_column
                self._shown[key] = row
            elif shown is not None:
                self.remove_row(key)
                del self._shown[key]
            elif match:
                self.add_row(*self._cells(row), key=key)
                self._shown[key] = row
                resort = True
        if resort:
            self._sort()
        self._keep(selected)

    def _apply_all(self, rows: dict[str, InstanceRow]) -> None:
        if rows.keys() != self._all.keys():
            self._index = {name: i for i, name in enumerate(rows)}
        self._all = rows
        visible = filtered(rows, self._filter)
        diff = diff_rows(self._shown, visible)
        if diff.empty:
            return
        if not self._shown or len(diff.added) > REBUILD_AT or len(diff.removed) > REBUILD_AT:
            self._rebuild(visible)
            return
        selected = self.selected
        for key in diff.removed:
            self.remove_row(key)
        for key in diff.added:
            self.add_row(*self._cells(visible[key]), key=key)
        for key, column, text in diff.changed:
            self.update_cell(key, COLUMN_KEYS[column], self._build(column, text))
        self._shown = visible
        if diff.added or sort_changed(diff, self.sort_column):
            self._sort()
        self._keep(selected)

    def set_filter(self, text: str) -> None:
        flt = Filter.parse(text)
        if flt == self._filter:
            return
        self._filter = flt
        self._rebuild(filtered(self._all, flt))

    def select(self, name: str) -> bool:
        """Move the cursor to `name`; False when the filter hides it."""
        if name not in self._shown:
            return False
        self.move_cursor(row=self.get_row_index(name))
        return True

    # -- sorting ------------------------------------------------------------------------

    def action_sort_next(self) -> None:
        current = -1 if self.sort_column is None else self.sort_column
        nxt = current + 1
        self.sort_by(None if nxt >= len(COLUMNS) else nxt, self.sort_reverse)

    def action_sort_reverse(self) -> None:
        self.sort_by(self.sort_column, not self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        index = event.column_index
        reverse = not self.sort_reverse if index == self.sort_column else False
        self.sort_by(index, reverse)

    def sort_by(self, column: int | None, reverse: bool) -> None:
        selected = self.selected
        self.sort_column, self.sort_reverse = column, reverse
        for index, (key, label) in enumerate(COLUMNS):
            arrow = (" ▼" if reverse else " ▲") if index == column else ""
            self.columns[ColumnKey(key)].label = Text(label + arrow)
        self._sort()
        self._keep(selected)
        self.refresh()

    def _sort(self) -> None:
        column, rows, index = self.sort_column, self._shown, self._index
        if column is None:
            self.sort("name", key=lambda cell: index.get(str(cell), 0), reverse=self.sort_reverse)
        else:
            self.sort(
                "name", key=lambda cell: rows[str(cell)].sort[column], reverse=self.sort_reverse
            )

    # -- internals ----------------------------------------------------------------------

    def _rebuild(self, visible: dict[str, InstanceRow]) -> None:
        selected = self.selected or self._last_selected
        self.clear()
        for key, row in visible.items():
            self.add_row(*self._cells(row), key=key)
        self._shown = visible
        if self.sort_column is not None or self.sort_reverse:
            self._sort()
        self._keep(selected)

    def _keep(self, selected: str | None) -> None:
        """Put the cursor back on the instance that was selected, wherever it moved."""
        if selected is None or selected not in self._shown:
            return
        index = self.get_row_index(selected)
        if index != self.cursor_row:
            self.move_cursor(row=index)

    def _cells(self, row: InstanceRow) -> list[Text]:
        return [self._build(i, text) for i, text in enumerate(row.cells)]

    @staticmethod
    def _build(column: int, text: str) -> Text:
        # Text, not str: DataTable would parse a str as markup, 4,096 x 10 times.
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

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        name = event.row_key.value
        if name != self._last_selected:
            self._last_selected = name
            self.post_message(self.SelectionChanged(name))
