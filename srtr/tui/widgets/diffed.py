"""A widget that shows one Rich renderable, as `Static` does, and repaints only its lines
whose cells changed when it is given another one of the same height.

A `Static.update` repaints the whole widget, and lays the screen out again unless told
not to. The detail pane and the header change every second, as their ages tick (`up 42s`),
and most of their lines stay the same: this widget draws the new renderable (a Rich layout
of a dozen lines, once), and when it has as many lines as the widget's height, compares
them with the lines drawn and hands the screen only those that differ, with no layout (a
layout of every pane cost more than the rest of an idle second). The lines are drawn as
`Static` draws them (Textual's `Visual.to_strips` at the widget's size and style).
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Self

from rich.console import RenderableType
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget


class DiffedStatic(Widget):
    """`Static`'s picture; `update` repaints the lines that changed."""

    DEFAULT_CSS = """
    DiffedStatic {
        height: auto;
    }
    """

    _lines: list[Strip] | None = None  # as drawn at `_drawn_at`
    _drawn_at: Size | None = None

    def __init__(self, content: RenderableType = "", *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._content: RenderableType = content
        self.lines_repainted = 0  # lines repainted alone, by updates (for tests)

    @property
    def content(self) -> RenderableType:
        """What it shows (as `Static.content`)."""
        return self._content

    def render(self) -> RenderableType:
        return self._content

    def update(self, content: RenderableType) -> None:
        """Show `content`: only its lines that changed are repainted, unless it has another
        height (or nothing was drawn yet): then it is repainted whole, and the screen laid
        out again unless the widget's height is fixed."""
        self._content = content
        old = self._lines if self._drawn_at == self.size else None
        new = None if old is None else self._draw(None)
        width, height = self.size
        if old is None or new is None or len(new) != height:
            # A height of its own (CSS) stays: the screen need not be laid out again.
            fixed = self.styles.height is not None and not self.styles.height.is_auto
            self.refresh(layout=not fixed)
            return
        for y, (before, after) in enumerate(zip_longest(old, new)):
            if before != after:
                self.lines_repainted += 1
                self.refresh(Region(0, y, width, 1))

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        if not regions:
            self._lines = None  # a whole repaint (a selection, a theme...) draws anew
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._lines = None  # another theme: other colours

    def _draw(self, height: int | None) -> list[Strip]:
        """The content's lines at this width (`height`: at most so many, as drawn)."""
        visual = visualize(self, self._content, markup=False)
        self._lines = Visual.to_strips(self, visual, self.size.width, height, self.visual_style)
        self._drawn_at = self.size
        return self._lines

    def render_line(self, y: int) -> Strip:
        lines = self._lines if self._drawn_at == self.size else None
        if lines is None:
            lines = self._draw(self.size.height)
        if y < len(lines):
            return lines[y]
        return Strip.blank(self.size.width, self.visual_style.rich_style)
