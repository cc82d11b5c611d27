"""The events pane: events.jsonl newest first, Warning events in yellow, JobFailed red.

Its ages tick every second, so the pane changes every second: only the lines in view are
drawn (a Line API widget), not the 200 it keeps to scroll back through, and a tick with no
new event repaints only the ages whose text changed.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from srtr.runtime.progress import REASON_WIDTH
from srtr.tui.viewmodel import EventLine

EMPTY = Text("no events yet", style="dim")
AGE_WIDTH = 6  # a line starts with its age, right-aligned in this many columns
AGE_STYLE = "dim"


def _ages_alone(old: list[EventLine], new: list[EventLine]) -> bool:
    """`new` is `old` with only ages changed (time passed, no event came)."""
    if len(old) != len(new) or not old:
        return False
    return all(
        (a.warning, a.reason, a.object, a.message, a.alarm)
        == (b.warning, b.reason, b.object, b.message, b.alarm)
        for a, b in zip(old, new, strict=True)
    )


def line_text(line: EventLine) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(_age(line), style=AGE_STYLE)
    text.append_text(_after_age(line))
    return text


def _age(line: EventLine) -> str:
    return f"{line.age:>{AGE_WIDTH}} "


def _after_age(line: EventLine) -> Text:
    """The line after its age: what an ages tick leaves as it was."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if line.alarm:
        text.append(f"{line.reason:<{REASON_WIDTH}}", style="bold red")
        text.append(f" {line.object}: ", style="bold")
        text.append(line.message, style="red")
    elif line.warning:
        text.append(f"{line.reason:<{REASON_WIDTH}}", style="bold yellow")
        text.append(f" {line.object}: ", style="bold")
        text.append(line.message, style="yellow")
    else:
        text.append(f"{line.reason:<{REASON_WIDTH}}", style="cyan")
        text.append(f" {line.object}: ", style="bold")
        text.append(line.message)
    return text


class EventsPane(ScrollView, can_focus=True):
    """A scrollable list of recent events; redrawn only when its lines change."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: list[EventLine] = []
        self._texts: dict[int, Text] = {}
        # Each line's segments after its age, as drawn at a width and base style: a tick
        # draws the new age alone in front of them.
        self._drawn: dict[int, tuple[tuple[int, Style], Style, list[Segment]]] = {}
        self.ages_repainted = 0  # ages repainted alone, by ticks (for tests)

    @property
    def text(self) -> str:
        """Every line, as plain text."""
        if not self._shown:
            return EMPTY.plain
        return "\n".join(line_text(line).plain for line in self._shown)

    def show(self, lines: list[EventLine]) -> None:
        if lines == self._shown:
            return
        if _ages_alone(self._shown, lines):
            self._tick(lines)
            return
        self._shown = lines
        self._texts = {}
        self._drawn = {}
        size = Size(0, max(1, len(lines)))  # lines are cut to the width: no sideways scroll
        if size != self.virtual_size:
            self.virtual_size = size
        self.refresh()

    def _tick(self, lines: list[EventLine]) -> None:
        """The same events, older: repaint the age of each line in view whose age text
        changed (a line's text once it is scrolled to), not the whole pane."""
        top = round(self.scroll_y)
        height = self.scrollable_content_region.height
        for index, (old, new) in enumerate(zip(self._shown, lines, strict=True)):
            if old.age == new.age:
                continue
            self._texts.pop(index, None)
            if top <= index < top + height:
                # Ages up to AGE_WIDTH keep the columns after them in place.
                longest = max(len(old.age), len(new.age))
                width = AGE_WIDTH + 1 if longest <= AGE_WIDTH else self.size.width
                self.ages_repainted += 1
                self.refresh(Region(0, index - top, width, 1))
        self._shown = lines

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        index = round(self.scroll_y) + y
        if index < len(self._shown) and width > AGE_WIDTH + 1:
            age = _age(self._shown[index])
            if len(age) == AGE_WIDTH + 1:  # the rest of the line stays in its columns
                return self._age_and_rest(index, age, width)
        if not self._shown:
            text = EMPTY if index == 0 else Text()
        elif index < len(self._shown):
            text = self._texts.get(index) or self._texts.setdefault(
                index, line_text(self._shown[index])
            )
        else:
            return Strip.blank(width, self.rich_style)
        return Strip(self._segments(text, width), width)

    def _age_and_rest(self, index: int, age: str, width: int) -> Strip:
        """The line at `index`: its `age`, then the rest as drawn before (drawn now if not)."""
        base = self.rich_style
        drawn = self._drawn.get(index)
        if drawn is None or drawn[0] != (width, base):
            rest = self._segments(_after_age(self._shown[index]), width - len(age))
            style = base + self.app.console.get_style(AGE_STYLE)
            drawn = self._drawn[index] = ((width, base), style, rest)
        return Strip([Segment(age, drawn[1]), *drawn[2]], width)

    def _segments(self, text: Text, width: int) -> list[Segment]:
        """`text` cut or padded to `width` cells, in this pane's style."""
        line = text.copy()
        line.truncate(width, overflow="ellipsis", pad=True)
        own = self.app.console.get_style(line.style) if isinstance(line.style, str) else line.style
        return [
            Segment(s.text, self.rich_style + own + (s.style or Style()))
            for s in line.render(self.app.console)
        ]
