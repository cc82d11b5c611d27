"""The log tail of the selected instance: follows the file; `p` shows the previous attempt.

Lines come from `source.LogFollower` (every appended byte, in order). The view keeps the
last MAX_LINES display lines; the file itself is never cut (`srtr logs` prints it whole).
Following pauses while the user scrolls up, and resumes at the bottom.
"""

from __future__ import annotations

from textual.widgets import Log

from srtr.tui.source import LogChunk
from srtr.tui.viewmodel import display_lines

MAX_LINES = 50_000


class LogView(Log):
    """A `Log` fed with `LogChunk`s; its border title says what is shown."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=MAX_LINES, highlight=False, auto_scroll=True)
        self.instance: str | None = None
        self.previous = False
        self.lines_received = 0  # since the last reset: for tests and the title
        self.border_title = "log"

    def apply(self, chunk: LogChunk) -> None:
        if chunk.reset:
            self.clear()
            self.lines_received = 0
            name, _path, previous = chunk.key
            self.instance, self.previous = name, previous
            if chunk.skipped:
                where = "srtr logs" if previous else "p: the log before the last restart"
                self.write_line(f"… {chunk.skipped:,} earlier bytes not shown ({where})")
            if chunk.note:
                self.write_line(f"[{chunk.note}]")
        if chunk.lines:
            self.lines_received += len(chunk.lines)
            self.write_lines(display_lines(chunk.lines))
        if chunk.reset:
            # A newly shown log opens at its end (for the previous attempt: its last words).
            # `write_lines` only follows a view that is already at the end, which a fresh
            # view may or may not be before its first layout; scroll once that is done.
            self.scroll_end(animate=False)
        self._title()

    def toggle_follow(self) -> bool:
        self.auto_scroll = not self.auto_scroll
        if self.auto_scroll:
            self.scroll_end(animate=False)
        self._title()
        return self.auto_scroll

    def _title(self) -> None:
        what = "before the last restart" if self.previous else "current attempt"
        follow = "" if self.previous else (" · following" if self.auto_scroll else " · paused")
        self.border_title = f"log {self.instance or ''} ({what}{follow})"
