"""The log of the selected instance: follows the file; `p` shows the previous attempt.

Lines come from `source.LogChunk`s (every appended byte, in order); the file itself is
never cut (`srtr logs` prints it whole). The view holds at most MAX_LINES lines; a newly
shown log loads its last `source.LOG_TAIL` bytes (thousands of lines load whole), and the
first row then says how many earlier lines are not loaded and that `L` loads them.

Following is a state, not a scroll position: while it is on, the view goes to the bottom
whenever lines arrive or its size changes (a banner or panel opening, the terminal
resized, the full screen toggled), so it never falls behind; scrolling up pauses it, and
reaching the bottom again (End, G, scrolling down) resumes it. The title says which.

Search (`/`, typed in the bottom border, incremental), `n`/`N`, `&` (only the matching
lines), `w` (wrap) and `t` (times) are the view's own keys (`keys.LOG_BINDINGS`). Each
new line costs O(1) (`viewmodel.LogLines`); rows are rendered only when on screen.

Times: srtr's logs are the programs' own output, with no time per line. `t` shows when
this view read each line (within a poll, 0.25 s, of its write while the view keeps up);
lines that were already in the file when the log was opened show `--:--:--`, because
nothing records when they were written.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.actions import SkipAction
from textual.binding import BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip

from srtr.tui import keys
from srtr.tui.source import LogChunk
from srtr.tui.viewmodel import LogLines, display_lines, match_spans, search_pattern, text_width

MAX_LINES = 200_000
TIME_WIDTH = 9  # "12:34:56 "
MATCH = Style(color="black", bgcolor="yellow")
CURRENT_MATCH = Style(color="black", bgcolor="dark_orange", bold=True)
DIM = Style(dim=True)


def _clean(line: str) -> str:
    """A line as a terminal cell grid can show it: tabs expanded, control codes replaced."""
    line = line.expandtabs()
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else "�" for c in line)


class LogView(ScrollView, can_focus=True):
    """The log pane; the same widget is the full-screen log (`l`)."""

    ALLOW_SELECT = True
    ALLOW_MAXIMIZE = True
    BINDINGS: ClassVar[list[BindingType]] = keys.LOG_BINDINGS
    DEFAULT_CSS = """
    LogView {
        background: $surface;
        color: $text;
        overflow: scroll;
        &:focus {
            background-tint: $foreground 5%;
        }
    }
    """

    class LoadEarlier(Message):
        """The user asked for the lines before the first one loaded."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = LogLines(MAX_LINES)
        self.instance: str | None = None
        self.previous = False
        self.lines_received = 0  # since the last reset: for tests and the title
        self.follow = True
        self.search_text = ""
        self.current: int | None = None  # the line of the current match
        self.typing: str | None = None  # the search being typed, while the prompt is open
        self.show_times = False
        self._width = 0  # the widest line, in cells
        self._note = ""
        self._more_earlier = False  # earlier lines of this view are not loaded
        self._cache: LRUCache[int, Strip] = LRUCache(1024)
        self.border_title = "log"
        self._titles: tuple[str, str] | None = None  # the border's title and subtitle shown

    @property
    def lines(self) -> list[str]:
        """The lines loaded, as shown (tabs expanded); oldest first."""
        return self.model.lines

    # -- content ------------------------------------------------------------------------

    def apply(self, chunk: LogChunk) -> None:
        if not (chunk.lines or chunk.reset or chunk.earlier):
            return  # a look that found nothing new: nothing on screen changes
        lines = [_clean(line) for line in display_lines(chunk.lines)]
        if chunk.reset:
            self.model.clear()
            self._cache.clear()
            self._width = 0
            self.lines_received = 0
            self.current = None
            name, _path, previous = chunk.key
            self.instance, self.previous = name, previous
            self._note = f"[{chunk.note}]" if chunk.note else ""
        if lines:
            self.lines_received += len(lines)
            self._width = max(self._width, max(map(text_width, lines)))
            if chunk.earlier:
                self.model.prepend(lines)
                self._cache.clear()
                if self.current is not None:
                    self.current += len(lines)
            else:
                dropped = self.model.dropped
                # Lines of a newly opened log were in the file before: no time is known.
                self.model.append(lines, None if chunk.reset else time.time())
                if self.model.dropped != dropped:
                    self._cache.clear()
                    self.current = None
            if not chunk.reset and self._note and self.lines_received == len(lines):
                self._note = self.model.head = ""  # "[no output yet]" is over
        if chunk.reset or chunk.earlier:
            self.model.head = self._head(chunk)
        self._layout()
        if chunk.reset:
            # A newly shown log opens at its end (for the previous attempt: its last words).
            self.follow = True
            self._stick()
        elif chunk.earlier:
            self.follow = False
            self.scroll_to(y=0, animate=False, immediate=True)
        else:
            self._stick()
            self.refresh()
        self._title()

    def _head(self, chunk: LogChunk) -> str:
        self._more_earlier = chunk.not_loaded_bytes > 0
        if self._note:
            return self._note
        if chunk.not_loaded_bytes > 0:
            if chunk.not_loaded_lines is None:
                size = f"over {chunk.not_loaded_bytes // (1024 * 1024)} MiB of"
            else:
                size = f"{chunk.not_loaded_lines:,}"
            return f"… {size} earlier lines not loaded (press L to load them)"
        if chunk.skipped and not self.previous:
            return (
                f"… {chunk.skipped:,} earlier bytes not shown (p: the log before the last restart)"
            )
        return ""

    def _layout(self) -> None:
        """Rows for the current width and modes; the virtual size that scrolls them."""
        width = self.size.width
        self.model.set_layout(wrap=self.model.wrap, width=width - self._prefix_width())
        content = width if self.model.wrap else self._width + self._prefix_width()
        self.virtual_size = Size(content, self.model.rows)

    def _prefix_width(self) -> int:
        return TIME_WIDTH if self.show_times else 0

    def _stick(self) -> None:
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self, event: events.Resize) -> None:
        # A banner, a panel, the full screen or the terminal changed the pane: still follow.
        self._cache.clear()
        self._layout()
        self._stick()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        was = self.follow
        at_end = new_value >= self.max_scroll_y
        if new_value < old_value and not at_end:
            self.follow = False  # the user scrolled up: pause
        elif new_value > old_value and at_end and not self.previous:
            self.follow = True  # back at the bottom: follow again
        if self.follow != was:
            self._title()

    def toggle_follow(self) -> bool:
        self.follow = not self.follow
        self._stick()
        self._title()
        return self.follow

    def _title(self) -> None:
        # The state first: a narrow pane cuts the end of its title, never the state.
        if self.previous:
            state = "before the last restart"
        else:
            state = "following" if self.follow else "paused"
        title, subtitle = f"log {state} · {self.instance or ''}", self._subtitle()
        # Setting a border title repaints the whole pane, even to the same text.
        if (title, subtitle) != self._titles:
            self._titles = (title, subtitle)
            self.border_title, self.border_subtitle = title, subtitle

    def _subtitle(self) -> str:
        parts: list[str] = []
        if self.typing is not None:
            parts.append(f"/{self.typing}▏ Enter: keep · Esc: cancel")
        elif self.search_text:
            found = len(self.model.matches)
            place = self.model.match_number(self.current)
            parts.append(
                f"/{self.search_text}: no match"
                if not found
                else f"/{self.search_text} {place or '-'}/{found:,} · n/N"
            )
        if self.model.only_matching:
            parts.append("& matching lines only")
        if self.model.wrap:
            parts.append("wrap")
        if self.show_times:
            parts.append("times: when read")
        return " · ".join(parts)

    # -- rendering ----------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        style = self.rich_style
        hit = self.model.row(scroll_y + y)
        if hit is None:
            return Strip.blank(width, style)
        index, piece = hit
        if index < 0:
            head = Text(self.model.head, no_wrap=True, end="")
            head.stylize(style)
            return Strip(head.render(self.app.console)).crop_extend(0, width, style)
        prefix = self._prefix(index, piece, style)
        content_width = max(1, width - len(prefix))
        line = self._line_strip(index, style)
        start = piece * content_width if self.model.wrap else scroll_x
        part = line.crop_extend(start, start + content_width, style).apply_offsets(start, index)
        if not prefix:
            return part
        return Strip.join([Strip([Segment(prefix, style + DIM)], len(prefix)), part])

    def _prefix(self, index: int, piece: int, style: Style) -> str:
        if not self.show_times:
            return ""
        at = self.model.times[index]
        if piece:
            return " " * TIME_WIDTH
        if at is None:
            return "--:--:-- "
        return time.strftime("%H:%M:%S ", time.localtime(at))

    def _line_strip(self, index: int, style: Style) -> Strip:
        selection = self.text_selection
        cached = self._cache.get(index)
        if cached is not None and selection is None:
            return cached
        line = self.model.lines[index]
        text = Text(line, no_wrap=True, end="")
        text.stylize(style)
        look = CURRENT_MATCH if index == self.current else MATCH
        for start, end in match_spans(self.model.pattern, line):
            text.stylize(look, start, end)
        if selection is not None and (span := selection.get_span(index)) is not None:
            start, end = span
            selected = self.screen.get_component_rich_style("screen--selection")
            text.stylize(selected, start, len(line) if end == -1 else end)
        strip = Strip(text.render(self.app.console), text_width(line))
        if selection is None:
            self._cache[index] = strip
        return strip

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self.model.lines)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self._cache.clear()
        self.refresh()

    # -- search -------------------------------------------------------------------------

    def action_search(self) -> None:
        self.typing = self.search_text
        self._title()

    def on_key(self, event: events.Key) -> None:
        """While the search prompt is open, keys edit the search (bindings wait)."""
        if self.typing is None:
            if event.key != "slash":
                return
            # Here, not only as a binding: bindings run once the key has bubbled up to the
            # App, and keys typed right after `/` would reach this widget before that.
            self.typing = self.search_text
        elif event.key == "enter":
            self.typing = None
        elif event.key == "escape":
            self.typing = None
            self._set_query("")
        elif event.key in ("backspace", "ctrl+h"):
            self._set_query(self.typing[:-1])
        elif event.key == "ctrl+u":
            self._set_query("")
        elif event.is_printable and event.character:
            self._set_query(self.typing + event.character)
        else:
            return  # arrows, Ctrl+C...: as usual
        # Keep the App from treating these keys as its bindings (`q` must not quit).
        event.stop()
        event.prevent_default()
        self._title()

    def _set_query(self, query: str) -> None:
        if self.typing is not None:
            self.typing = query
        self.search_text = query
        self.model.set_pattern(search_pattern(query))
        self._cache.clear()
        self.current = None
        self._layout()
        if self.model.matches:
            # The newest match at or above the bottom of the view: a log is read upwards.
            bottom = self._line_at(self.scroll_offset.y + self.size.height - 1)
            self._jump(self.model.next_match(bottom + 1, forward=False))
        elif self.model.only_matching:
            self._stick()
        self.refresh()
        self._title()

    def _line_at(self, row: int) -> int:
        """The line shown at `row`, or the last line when the row is past the end."""
        hit = self.model.row(min(row, self.model.rows - 1)) if self.model.rows else None
        if hit is None or hit[0] < 0:
            shown = self.model.shown
            return shown[0] - 1 if hit is not None and shown else len(self.model.lines) - 1
        return hit[0]

    def _jump(self, line: int | None) -> None:
        """Make `line` the current match, scrolling to it only when it is off screen."""
        if line is None:
            return
        self.current = line
        self._cache.clear()
        row = self.model.row_of(line)
        top = self.scroll_offset.y
        if not top <= row < top + self.size.height:
            self.follow = False
            self.scroll_to(y=max(0, row - self.size.height // 3), animate=False, immediate=True)
        self.refresh()
        self._title()

    def _step(self, forward: bool) -> None:
        if not self.search_text:
            self.app.notify("no search: / searches the log", severity="warning", timeout=2)
            return
        if not self.model.matches:
            self.app.notify(f"no match for {self.search_text!r}", severity="warning", timeout=2)
            return
        if self.current is not None:
            origin = self.current
        else:
            origin = self._line_at(self.scroll_offset.y if forward else self.scroll_offset.y - 1)
        self._jump(self.model.next_match(origin, forward))

    def action_next_match(self) -> None:
        self._step(forward=True)

    def action_previous_match(self) -> None:
        self._step(forward=False)

    def action_escape(self) -> None:
        if not self.search_text:
            raise SkipAction()  # the App's Esc: leave the full screen, discard an edit
        self._set_query("")

    # -- modes --------------------------------------------------------------------------

    def _keep_in_view(self) -> None:
        """Apply a change of rows, keeping the current match (or the top line) in view."""
        anchor = self.current if self.current is not None else self._line_at(self.scroll_offset.y)
        self._cache.clear()
        self._layout()
        if self.follow:
            self._stick()
        else:
            row = self.model.row_of(max(0, anchor))
            self.scroll_to(y=max(0, row - self.size.height // 3), animate=False, immediate=True)
        self.refresh()
        self._title()

    def action_only_matching(self) -> None:
        if not self.search_text and not self.model.only_matching:
            self.app.notify("search first (/): & then shows only the matching lines", timeout=3)
            return
        self.model.set_only_matching(not self.model.only_matching)
        self._keep_in_view()

    def action_wrap(self) -> None:
        self.model.set_layout(wrap=not self.model.wrap, width=self.model.width)
        self._keep_in_view()

    def action_times(self) -> None:
        self.show_times = not self.show_times
        self._keep_in_view()

    def action_load_earlier(self) -> None:
        if not self._more_earlier:
            self.app.notify("every line of this log is loaded", timeout=2)
            return
        self.post_message(self.LoadEarlier())

    # Scrolling jumps rather than glides: a log is read like `less`, and the title must say
    # "paused" or "following" for the position on screen, not for one still on its way.
    def action_scroll_up(self) -> None:
        self.scroll_up(animate=False)

    def action_scroll_down(self) -> None:
        self.scroll_down(animate=False)

    def action_page_up(self) -> None:
        self.scroll_page_up(animate=False)

    def action_page_down(self) -> None:
        self.scroll_page_down(animate=False)

    def action_top(self) -> None:
        self.follow = False
        self.scroll_to(y=0, animate=False, immediate=True)
        self._title()

    def action_bottom(self) -> None:
        self.follow = not self.previous
        self.scroll_end(animate=False, immediate=True, x_axis=False)
        self._title()
