"""The log view: where a log splits at its last restart marker, and lines as shown."""

from __future__ import annotations

from collections.abc import Iterable

from srtr.reconciler.rundir import RESTART_MARKER, parse_restart_marker

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
