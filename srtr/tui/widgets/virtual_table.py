"""A table that draws only the rows on screen: the base of the instances table and the grid.

Textual's DataTable keeps every row (adding 80,000 of them takes seconds, and sorting them
is done on its own copy), so a job of 80,000 instances cannot feed it. Here a subclass says
how many rows there are and draws one row on request (`row_cells`); the table asks only for
the rows in view, and a refresh of 40 lines costs the same for 40 instances or 80,000.

The header stays on top; below it the rows scroll. A cursor marks one row (`cursor_type`
"row") or one cell ("cell"); moving it scrolls it into view and calls `cursor_moved`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.events import Click
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

PAD = 1  # blank columns either side of a cell, as DataTable draws them
# Cells drawn, kept by text, style and width: a line drawn again (an AGE that ticked) draws
# only its new cells. Most cells of a page repeat (phase, ready, service), so a few pages'
# worth is plenty; the theme changing changes the styles, hence the keys.
CELLS_KEPT = 4096


@dataclass
class Column:
    key: str
    label: Text
    width: int


class VirtualTable(ScrollView, can_focus=True):
    """Rows drawn on demand; subclasses give `row_count` and `row_cells`."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "virtual-table--header",
        "virtual-table--cursor",
        "virtual-table--even-row",
    }
    DEFAULT_CSS = """
    VirtualTable {
        background: $surface;
        color: $foreground;
        & > .virtual-table--header { text-style: bold; background: $panel; }
        & > .virtual-table--even-row { background: $surface-lighten-1 50%; }
        & > .virtual-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
        }
        &:focus > .virtual-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
        &:dark > .virtual-table--even-row { background: $surface-darken-1 40%; }
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False, key_display="↑ ↓"),
        Binding("down", "cursor_down", "Down", show=False, key_display="↑ ↓"),
        Binding("left", "cursor_left", "Left", show=False, key_display="← →"),
        Binding("right", "cursor_right", "Right", show=False, key_display="← →"),
        Binding("pageup", "page_up", "Page up", show=False, key_display="PgUp PgDn"),
        Binding("pagedown", "page_down", "Page down", show=False, key_display="PgUp PgDn"),
        Binding("home", "scroll_top", "Top", show=False, key_display="g"),
        Binding("end", "scroll_bottom", "Bottom", show=False, key_display="G"),
        Binding("enter", "select_cursor", "Select", show=False, key_display="Enter"),
    ]

    def __init__(
        self, *, id: str | None = None, cursor_type: str = "row", zebra_stripes: bool = False
    ) -> None:
        super().__init__(id=id)
        self.cursor_type = cursor_type
        self.zebra_stripes = zebra_stripes
        self.columns: list[Column] = []
        self.cursor_row = 0
        self.cursor_column = 0
        self._cells_drawn: dict[tuple[object, ...], list[Segment]] = {}

    # -- what subclasses give -------------------------------------------------------------

    @property
    def row_count(self) -> int:
        raise NotImplementedError

    def row_cells(self, position: int) -> list[Text]:
        """The cells of the row shown at `position`, in column order."""
        raise NotImplementedError

    def cursor_moved(self) -> None:
        """The cursor is on another row (or cell) now."""

    def cursor_chosen(self) -> None:
        """Enter, or a click, on the cursor."""

    def header_clicked(self, column: int) -> None:
        """A click on a column's heading."""

    # -- shape ----------------------------------------------------------------------------

    def set_columns(self, columns: list[Column]) -> None:
        self.columns = columns
        self.reshape()

    def reshape(self) -> None:
        """The row count or the columns changed: fit the scroll area and the cursor."""
        width = sum(c.width + 2 * PAD for c in self.columns)
        size = Size(width, self.row_count + 1)
        if size != self.virtual_size:  # a new size lays the screen out again: only if it is
            self.virtual_size = size
        self.cursor_row = max(0, min(self.cursor_row, self.row_count - 1))
        self.cursor_column = max(0, min(self.cursor_column, len(self.columns) - 1))
        self.refresh()

    @property
    def page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    # -- the cursor -----------------------------------------------------------------------

    def move_cursor(self, *, row: int | None = None, column: int | None = None) -> None:
        old = (self.cursor_row, self.cursor_column)
        if row is not None:
            self.cursor_row = max(0, min(row, self.row_count - 1))
        if column is not None:
            self.cursor_column = max(0, min(column, len(self.columns) - 1))
        self._scroll_to_cursor()
        self.refresh()
        if (self.cursor_row, self.cursor_column) != old:
            self.cursor_moved()

    def _scroll_to_cursor(self) -> None:
        top, page = round(self.scroll_y), self.page
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + page:
            self.scroll_to(y=self.cursor_row - page + 1, animate=False, immediate=True)
        if self.cursor_type == "cell":
            left = sum(c.width + 2 * PAD for c in self.columns[: self.cursor_column])
            right = left + self.columns[self.cursor_column].width + 2 * PAD if self.columns else 0
            view = self.scrollable_content_region.width
            if left < self.scroll_x:
                self.scroll_to(x=left, animate=False, immediate=True)
            elif right > self.scroll_x + view:
                self.scroll_to(x=right - view, animate=False, immediate=True)

    def action_cursor_up(self) -> None:
        self.move_cursor(row=self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(row=self.cursor_row + 1)

    def action_cursor_left(self) -> None:
        if self.cursor_type == "cell":
            self.move_cursor(column=self.cursor_column - 1)
        else:
            self.scroll_left(animate=False)

    def action_cursor_right(self) -> None:
        if self.cursor_type == "cell":
            self.move_cursor(column=self.cursor_column + 1)
        else:
            self.scroll_right(animate=False)

    def action_page_up(self) -> None:
        self.move_cursor(row=self.cursor_row - self.page)

    def action_page_down(self) -> None:
        self.move_cursor(row=self.cursor_row + self.page)

    def action_scroll_top(self) -> None:
        self.move_cursor(row=0)

    def action_scroll_bottom(self) -> None:
        self.move_cursor(row=self.row_count - 1)

    def action_select_cursor(self) -> None:
        if self.row_count:
            self.cursor_chosen()

    def on_click(self, event: Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        x = offset.x + round(self.scroll_x)
        column = self._column_at(x)
        if offset.y == 0:
            if column is not None:
                self.header_clicked(column)
            return
        row = round(self.scroll_y) + offset.y - 1
        if row < self.row_count:
            self.move_cursor(row=row, column=column)
            self.cursor_chosen()

    def _column_at(self, x: int) -> int | None:
        for index, column in enumerate(self.columns):
            x -= column.width + 2 * PAD
            if x < 0:
                return index
        return None

    # -- drawing --------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        scroll_x = round(self.scroll_x)
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("virtual-table--header")
            strip = self._strip([c.label for c in self.columns], base + header, None)
        else:
            position = round(self.scroll_y) + y - 1
            if position >= self.row_count:
                return Strip.blank(width, base)
            style = base
            if self.zebra_stripes and position % 2:
                style += self.get_component_rich_style("virtual-table--even-row")
            cursor = None
            if position == self.cursor_row:
                mark = self.get_component_rich_style("virtual-table--cursor")
                if self.cursor_type == "row":
                    style += mark
                else:
                    cursor = (self.cursor_column, mark)
            strip = self._strip(self.row_cells(position), style, cursor)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    def _strip(self, cells: list[Text], style: Style, cursor: tuple[int, Style] | None) -> Strip:
        segments: list[Segment] = []
        cache = self._cells_drawn
        for index, (column, cell) in enumerate(zip(self.columns, cells, strict=False)):
            cell_style = style
            if cursor is not None and cursor[0] == index:
                cell_style = style + cursor[1]
            key = (cell.plain, cell.style, tuple(cell.spans), column.width, cell_style)
            drawn = cache.get(key)
            if drawn is None:
                if len(cache) >= CELLS_KEPT:
                    cache.clear()
                drawn = cache[key] = self._cell(cell, column.width, cell_style)
            segments += drawn
        return Strip(segments)

    def _cell(self, cell: Text, width: int, cell_style: Style) -> list[Segment]:
        console = self.app.console
        text = cell.copy()
        text.truncate(width, overflow="ellipsis", pad=True)
        text.pad_left(PAD)
        text.pad_right(PAD)
        # `Text.render` leaves out the Text's own style (only its spans): add it here.
        own = console.get_style(cell.style) if isinstance(cell.style, str) else cell.style
        cell_style += own
        return [
            Segment(segment.text, cell_style + (segment.style or Style()))
            for segment in text.render(console)
        ]
