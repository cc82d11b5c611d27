"""The node grid: one row per node, a column for the owner and one per rider, by phase.

Rider columns are narrow (headings abbreviated to 8 characters, `METRICS…`); with more
riders than fit, the grid scrolls sideways (← →). Failed, Lost and BackOff cells are
filled, so that one failure among 8 x 5 cells is seen at once.

Drawn like the instances table, only the page on screen: a new grid (built in the reading
thread) replaces the old one and the lines in view are redrawn, whether the job has 8 nodes
or 10,000.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.message import Message

from srtr.tui.viewmodel import GridCell, NodeGrid, column_label
from srtr.tui.widgets.virtual_table import Column, VirtualTable

CELL_WIDTH = 9  # the widest cell, `↻ BackOff`
ROLE_WIDTH = 10


class NodeGridTable(VirtualTable):
    """Enter (or a click) on a cell selects that instance in the instances table."""

    class InstanceChosen(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="cell")
        self._grid: NodeGrid | None = None
        self._node_names: list[str] = []

    @property
    def row_count(self) -> int:
        return len(self._node_names)

    def show(
        self, grid: NodeGrid, changes: Sequence[tuple[str, int, GridCell]] | None = None
    ) -> None:
        """Show `grid` (`changes`, its cells that differ from the previous grid, are not
        needed: only the lines on screen are drawn, from the grid itself)."""
        old = self._grid
        if grid is old:
            return  # the same snapshot again (ages tick): nothing in the grid moved
        self._grid = grid
        if old is not None and old.columns == grid.columns and old.rows.keys() == grid.rows.keys():
            self.refresh()
            return
        self._node_names = list(grid.rows)
        node_width = max((len(n) for n in self._node_names), default=4)
        columns = [
            Column("node", Text("NODE"), max(4, node_width)),
            Column("c0", Text("ROLE"), ROLE_WIDTH),
        ]
        for index, label in enumerate(grid.columns, start=1):
            # Narrow columns, one per rider; the grid scrolls sideways past the pane.
            columns.append(Column(f"c{index}", Text(column_label(label)), CELL_WIDTH))
        self.set_columns(columns)

    def row_cells(self, position: int) -> list[Text]:
        assert self._grid is not None
        node = self._node_names[position]
        return [Text(node), *(self._build(c) for c in self._grid.rows[node])]

    @staticmethod
    def _build(cell: GridCell) -> Text:
        return Text(cell.text, style=cell.style or "dim")

    def cursor_chosen(self) -> None:
        grid = self._grid
        column = self.cursor_column - 1  # the NODE column has no cell model
        if grid is None or column < 0 or not self._node_names:
            return
        cell = grid.rows[self._node_names[self.cursor_row]][column]
        if cell.instance:
            self.post_message(self.InstanceChosen(cell.instance))
