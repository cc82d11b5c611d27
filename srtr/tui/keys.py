"""The App's key bindings, and the keys its widgets handle, as the help screen lists them.

Keys (also under `?`): `/` filter, `o`/`O` sort, `j`/`k` move, `r` restart, `s` stop,
`T` or Ctrl+C tear down, `K` (or Ctrl+C while tearing down) kill, `p` the log before the
last restart, `f` follow/pause the log, `l` log full screen, `e` events, `a` apply a
pending recipe edit (Esc discards it), `?` help, `q` quit.

In the log (the pane once focused with Tab, and the full-screen log at once): `/` search,
`n`/`N` next/previous match, `&` only the matching lines, `w` wrap, `t` times, `L` load
earlier lines, `g`/`G` (Home/End) first/last line (`LOG_BINDINGS`).
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding, BindingType

BINDINGS: list[BindingType] = [
    Binding("slash", "filter", "Filter", key_display="/", tooltip="Filter the instances"),
    Binding("r", "restart", "Restart", tooltip="Restart the selected instance (asks first)"),
    Binding("s", "stop", "Stop", tooltip="Stop the selected instance for good (asks first)"),
    Binding("T", "teardown", "Teardown", tooltip="Tear the job down, tier by tier (asks)"),
    Binding("K", "kill", "Kill", show=False, tooltip="SIGKILL every instance now (asks)"),
    Binding("a", "apply_plan", "Apply edit", tooltip="Apply the pending recipe edit"),
    Binding("p", "previous_log", "Prev log", tooltip="Log before the last restart / current"),
    Binding("f", "follow", "Follow", show=False, tooltip="Follow the log, or pause it"),
    Binding("l", "zoom_log", "Log", tooltip="Log full screen (again: back)"),
    Binding("e", "focus_events", "Events", show=False, tooltip="Focus the events pane"),
    Binding("question_mark", "help", "Help", key_display="?", tooltip="This help"),
    Binding("q", "quit", "Quit", tooltip="Quit (srtr up: tears the job down, asks first)"),
    Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    Binding(
        "ctrl+c",
        "interrupt",
        "Teardown/kill",
        show=False,
        priority=True,
        tooltip="Tear down (asks; again: yes); while tearing down: kill",
    ),
    Binding("escape", "escape", "Back", show=False),
]
# Keys handled by widgets, for the help screen (they are not App bindings).
OTHER_KEYS: list[tuple[str, str]] = [
    ("↑ ↓ j k", "move in the instances table (the detail pane and log follow)"),
    ("g G", "first / last instance"),
    ("o / O", "sort by the next column / reverse (or click a header)"),
    ("Tab", "next pane (table, node grid, log, events)"),
    ("Enter", "in the node grid: select that instance"),
    ("Esc", "clear the filter · leave the full-screen log · discard a pending recipe edit"),
]


# The log view's own keys: its BINDINGS, and so in the footer while it has focus.
LOG_BINDINGS: list[BindingType] = [
    Binding("slash", "search", "Search", key_display="/", tooltip="In the log: search it"),
    Binding("n", "next_match", "Next", tooltip="In the log: next match (down)"),
    Binding("N", "previous_match", "Prev", show=False, tooltip="In the log: previous match"),
    Binding(
        "ampersand",
        "only_matching",
        "Matching",
        key_display="&",
        tooltip="In the log: show only the lines that match the search (again: all)",
    ),
    Binding("w", "wrap", "Wrap", tooltip="In the log: wrap long lines (again: scroll sideways)"),
    Binding("t", "times", "Times", tooltip="In the log: when this view read each line"),
    Binding("L", "load_earlier", "Earlier", show=False, tooltip="In the log: load earlier lines"),
    Binding(
        "g,home", "top", "Top", show=False, key_display="g Home", tooltip="In the log: first line"
    ),
    Binding(
        "G,end",
        "bottom",
        "Bottom",
        show=False,
        key_display="G End",
        tooltip="In the log: last line, follow",
    ),
    Binding("escape", "escape", "Clear search", show=False),
]
# The log's keys as the help screen lists them (Esc is listed with the other keys).
OTHER_KEYS += [
    (binding.key_display or binding.key, binding.tooltip or binding.description)
    for binding in LOG_BINDINGS
    if isinstance(binding, Binding) and binding.key != "escape"
]


def help_keys(
    bindings: Iterable[BindingType], other: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """(key, what it does) for the help screen: the bindings, then the widgets' keys."""
    keys: list[tuple[str, str]] = []
    for binding in bindings:
        assert isinstance(binding, Binding)
        if binding.key in ("escape", "ctrl+q"):
            continue  # Esc is listed with the widgets' keys; ctrl+q is q
        description = binding.tooltip or binding.description
        keys.append((binding.key_display or binding.key, description))
    return keys + list(other)
