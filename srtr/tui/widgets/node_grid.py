"""The node grid: one row per node, a column for the owner and one per rider, by phase.

Rider columns are narrow (headings abbreviated to 8 characters, `METRICS…`); with more
riders than fit, the grid scrolls sideways (← →). Failed, Lost and BackOff cells are
filled, so that one failure among 8 x 5 cells is seen at once.

Updated like the instances table: cells are diffed and written one by one, and the grid
is rebuilt only when its nodes or rider columns change (a live edit).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from srtr.tui.viewmodel import GridCell, NodeGrid, column_label, diff_grid

CELL_WIDTH = 9  # the widest cell, `↻ BackOff`


class NodeGridTable(DataTable[Any]):
    """Enter (or a click) on a cell selects that instance in the instances table."""

    class InstanceChosen(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="cell", show_cursor=True)
        self._grid: NodeGrid | None = None

    def show(self, grid: NodeGrid, changes: list[tuple[str, int, GridCell]] | None = None) -> None:
        """Show `grid`; `changes` are its cells that differ from the previous grid, if known."""
        old = self._grid
        same_shape = (
            old is not None and old.columns == grid.columns and old.rows.keys() == grid.rows.keys()
        )
        if same_shape and old is not None:
            for node, index, cell in diff_grid(old.rows, grid.rows) if changes is None else changes:
                self.update_cell(node, f"c{index}", self._build(cell))
        else:
            self.clear(columns=True)
            self.add_column("NODE", key="node")
            self.add_column("ROLE", key="c0")
            for index, label in enumerate(grid.columns, start=1):
                # Narrow columns, one per rider; the grid scrolls sideways past the pane.
                self.add_column(column_label(label), key=f"c{index}", width=CELL_WIDTH)
            for node, cells in grid.rows.items():
                self.add_row(Text(node), *(self._build(c) for c in cells), key=node)
        self._grid = grid

    @staticmethod
    def _build(cell: GridCell) -> Text:
        return Text(cell.text, style=cell.style or "dim")

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        event.stop()
        grid = self._grid
        column = event.coordinate.column - 1  # the NODE column has no cell model
        node = event.cell_key.row_key.value
        if grid is None or node is None or column < 0:
            return
        cell = grid.rows[node][column]
        if cell.instance:
            self.post_message(self.InstanceChosen(cell.instance))
