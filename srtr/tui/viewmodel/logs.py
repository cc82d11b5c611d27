"""The log view: where a log splits at its last restart marker, and lines as shown."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence

from rich.cells import cell_len

from srtr.store.rundir import RESTART_MARKER, parse_restart_marker

# The backend appends a restart marker (`rundir.restart_marker`) before each restart.
LONG_LINE = 4096  # a longer line is shown as several display lines, so rendering stays cheap


def is_restart_marker(text: str) -> bool:
    """Whether `text` (a line, or the rest of one) is exactly a restart marker."""
    return parse_restart_marker(text) is not None


def split_at_last_marker(text: str) -> tuple[str, str]:
    """(`before`, `after`): the log before the last restart, and the current attempt's.

    `after` starts with the marker itself; without a marker, everything is current.
    """
    last = None
    for last in RESTART_MARKER.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return "", text
    return text[: last.start()], text[last.start() :]


def display_lines(lines: Iterable[str], limit: int = LONG_LINE) -> list[str]:
    """Lines as the log view shows them: none dropped, long ones split, blanks kept.

    The log widget drops empty strings and splits on every line break it knows, so a blank
    line becomes one space and a very long line several pieces marked with `↪`.
    """
    out: list[str] = []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            out.append(" ")
            continue
        for piece in line.splitlines() or [" "]:
            if len(piece) <= limit:
                out.append(piece or " ")
            else:
                out.append(piece[:limit])
                out.extend("↪ " + piece[i : i + limit] for i in range(limit, len(piece), limit))
    return out


class Search:
    """The `/` search of the log view: plain text (no regex syntax to trip over), and
    case-insensitive unless the query has a capital letter ("smart case", as in less -i).

    `search` is the test of every line (filtering 200,000 lines must take milliseconds:
    a substring test, not a regex, which Python runs much slower with IGNORECASE); the
    regex only finds the spans to highlight in the lines on screen.
    """

    def __init__(self, query: str) -> None:
        self.query = query
        self.fold = not any(c.isupper() for c in query)
        self.needle = query.lower() if self.fold else query
        self.regex = re.compile(re.escape(query), re.IGNORECASE if self.fold else 0)

    def search(self, text: str) -> bool:
        return self.needle in (text.lower() if self.fold else text)

    def matching(self, lines: Sequence[str], indices: Iterable[int]) -> list[int]:
        """The indices of the `lines` that match, of those in `indices` (in one loop, with
        no call per line: this is what a search over every line costs)."""
        needle = self.needle
        if self.fold:
            return [i for i in indices if needle in lines[i].lower()]
        return [i for i in indices if needle in lines[i]]

    def narrows(self, other: Search | None) -> bool:
        """Whether every line this search matches is also matched by `other` (typing one
        more letter): then only `other`'s matches need testing."""
        return other is not None and other.fold == self.fold and other.needle in self.needle


def search_pattern(query: str) -> Search | None:
    return Search(query) if query else None


def match_spans(pattern: Search | None, text: str) -> list[tuple[int, int]]:
    """(start, end) of every non-overlapping match of `pattern` in `text`."""
    if pattern is None:
        return []
    return [m.span() for m in pattern.regex.finditer(text)]


def text_width(text: str) -> int:
    """Cells `text` takes (ASCII: one each, found without looking at every character)."""
    return len(text) if text.isascii() else cell_len(text)


class LogLines:
    """The lines of the log view, and the rows they take on screen.

    Appending costs only the new lines: matches of the search and, when wrapping, the rows
    of each line are extended, never recomputed. Recomputing everything (O(lines)) happens
    only on what the user asks: a new search, the wrap or width changing, earlier lines
    loaded, or the oldest lines dropped past `cap` (in batches of a tenth, so rarely).

    Rows: `head` (a note about what is not loaded, if any) takes row 0; then the shown lines
    (all of them, or only the matching ones), one row each, or, when wrapping, as many
    rows as their width needs at `width` cells.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.lines: list[str] = []
        self.times: list[float | None] = []  # when this view read each line; None: before
        self.head = ""
        self.pattern: Search | None = None
        self.matches: list[int] = []  # indices of the lines the pattern matches, in order
        self.only_matching = False
        self.wrap = False
        self.width = 80  # cells a wrapped row holds
        self.dropped = 0  # oldest lines dropped past `cap` since the last clear
        self._starts: list[int] = []  # wrap: the first row of each shown line
        self._wrapped_rows = 0

    # -- content ------------------------------------------------------------------------

    def clear(self) -> None:
        self.lines, self.times, self.matches = [], [], []
        self.head, self.dropped = "", 0
        self._relayout()

    def append(self, lines: Sequence[str], at: float | None) -> None:
        first = len(self.lines)
        self.lines.extend(lines)
        self.times.extend([at] * len(lines))
        new = self._matching(range(first, len(self.lines)))
        self.matches.extend(new)
        if self.wrap:
            self._extend_rows(new if self.only_matching else range(first, len(self.lines)))
        if len(self.lines) > self.cap:
            self._drop(len(self.lines) - self.cap + self.cap // 10)

    def prepend(self, lines: Sequence[str]) -> None:
        """Earlier lines, loaded on request (they were in the file before this view)."""
        self.lines[:0] = lines
        self.times[:0] = [None] * len(lines)
        self._rematch()

    def _drop(self, count: int) -> None:
        del self.lines[:count]
        del self.times[:count]
        self.dropped += count
        self._rematch()

    # -- search and filter --------------------------------------------------------------

    def set_pattern(self, pattern: Search | None) -> None:
        narrower = pattern is not None and pattern.narrows(self.pattern)
        self.pattern = pattern
        if narrower:
            self.matches = self._matching(self.matches)
            self._relayout()
        else:
            self._rematch()

    def _matching(self, indices: Iterable[int]) -> list[int]:
        if self.pattern is None:
            return []
        return self.pattern.matching(self.lines, indices)

    def _rematch(self) -> None:
        self.matches = self._matching(range(len(self.lines)))
        self._relayout()

    def set_only_matching(self, on: bool) -> None:
        self.only_matching = on
        self._relayout()

    def next_match(self, line: int, forward: bool) -> int | None:
        """The first matching line after `line` (before it, going back), wrapping around."""
        if not self.matches:
            return None
        if forward:
            k = bisect.bisect_right(self.matches, line)
            return self.matches[k % len(self.matches)]
        k = bisect.bisect_left(self.matches, line) - 1
        return self.matches[k % len(self.matches)]

    def match_number(self, line: int | None) -> int:
        """1-based place of `line` among the matches (0: not a match)."""
        if line is None:
            return 0
        k = bisect.bisect_left(self.matches, line)
        return k + 1 if k < len(self.matches) and self.matches[k] == line else 0

    # -- rows ---------------------------------------------------------------------------

    @property
    def shown(self) -> Sequence[int]:
        return self.matches if self.only_matching else range(len(self.lines))

    def set_layout(self, *, wrap: bool, width: int) -> None:
        width = max(1, width)
        if (wrap, width) != (self.wrap, self.width) or (wrap and not self._starts):
            self.wrap, self.width = wrap, width
            self._relayout()

    def _relayout(self) -> None:
        self._starts, self._wrapped_rows = [], 0
        if self.wrap:
            self._extend_rows(self.shown)

    def _extend_rows(self, indices: Iterable[int]) -> None:
        width, lines, starts = self.width, self.lines, self._starts
        rows = self._wrapped_rows
        for i in indices:
            starts.append(rows)
            rows += max(1, -(-text_width(lines[i]) // width))
        self._wrapped_rows = rows

    @property
    def head_rows(self) -> int:
        return 1 if self.head else 0

    @property
    def rows(self) -> int:
        body = self._wrapped_rows if self.wrap else len(self.shown)
        return self.head_rows + body

    def row(self, y: int) -> tuple[int, int] | None:
        """(line index, piece) shown at row `y`; (-1, 0) is the head; None: past the end."""
        y -= self.head_rows
        if y < 0:
            return (-1, 0)
        shown = self.shown
        if not self.wrap:
            return (shown[y], 0) if y < len(shown) else None
        if y >= self._wrapped_rows:
            return None
        k = bisect.bisect_right(self._starts, y) - 1
        return shown[k], y - self._starts[k]

    def row_of(self, line: int) -> int:
        """The first row of `line`, or of the next shown line when it is not shown."""
        shown = self.shown
        k = bisect.bisect_left(shown, line) if self.only_matching else min(line, len(shown))
        if self.wrap:
            body = self._starts[k] if k < len(self._starts) else self._wrapped_rows
        else:
            body = k
        return self.head_rows + body
