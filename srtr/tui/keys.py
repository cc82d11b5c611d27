"""The App's key bindings, and the keys its widgets handle, as the help screen lists them.

Keys (also under `?`): `/` filter, `o`/`O` sort, `j`/`k` move, `r` restart, `s` stop,
`T` or Ctrl+C tear down, `K` (or Ctrl+C while tearing down) kill, `p` the log before the
last restart, `f` follow/pause the log, `l` log full screen, `e` events, `a` apply a
pending recipe edit (Esc discards it), `d` detach (`srtr up`), `c` next theme, `?` help,
`q` quit.

In the log (the pane once focused with Tab, and the full-screen log at once): `/` search,
`n`/`N` next/previous match, `&` only the matching lines, `w` wrap, `t` times, `L` load
earlier lines, `g`/`G` (Home/End) first/last line (`LOG_BINDINGS`).

Every table of keys is here, the widgets' too (they use these lists as their BINDINGS),
so `?` (`help_keys`) and docs/cli.md list every key; tests/tui/test_screens.py checks that
no widget has a key the help does not list.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding, BindingType

# The instances table's own keys (InstancesTable.BINDINGS).
TABLE_BINDINGS: list[BindingType] = [
    Binding("j", "cursor_down", "Down", show=False, tooltip="In the table: next instance"),
    Binding("k", "cursor_up", "Up", show=False, tooltip="In the table: previous instance"),
    Binding("g", "scroll_top", "Top", show=False, tooltip="In the table: first instance"),
    Binding("G", "scroll_bottom", "Bottom", show=False, tooltip="In the table: last instance"),
    Binding("o", "sort_next", "Sort", tooltip="Sort by the next column (or click a header)"),
    Binding("O", "sort_reverse", "Reverse", show=False, tooltip="Reverse the sort"),
]
# The keys of the dialogs and the `/` filter (ConfirmModal, HelpScreen, FilterBar BINDINGS).
CONFIRM_BINDINGS: list[BindingType] = [
    Binding("y", "answer(True)", "Yes", tooltip="In a confirmation: yes"),
    Binding(
        "n,escape", "answer(False)", "No", key_display="n Esc", tooltip="In a confirmation: no"
    ),
]
HELP_BINDINGS: list[BindingType] = [
    Binding(
        "escape,question_mark,q",
        "dismiss",
        "Close",
        key_display="Esc ? q",
        tooltip="Close this help",
    ),
]
FILTER_BINDINGS: list[BindingType] = [
    Binding(
        "escape",
        "close(True)",
        "Clear filter",
        key_display="Esc",
        tooltip="In the filter: clear it and close it (Enter keeps it)",
    ),
]

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
    Binding("d", "detach", "Detach", tooltip="srtr up: leave the TUI, the job goes on (srtr tui)"),
    Binding("c", "cycle_theme", "Colours", show=False, tooltip="Next theme: dark, light, terminal"),
    Binding("question_mark", "help", "Help", key_display="?", tooltip="This help"),
    Binding("q", "quit", "Quit", tooltip="Quit (srtr up: tears the job down, asks first)"),
    Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    Binding(
        "ctrl+c",
        "interrupt",
        "Teardown/kill",
        show=False,
        priority=True,
        key_display="Ctrl+C",
        tooltip="Tear down (asks; again: yes); while tearing down: kill",
    ),
    Binding("escape", "escape", "Back", show=False),
]
# Keys handled by widgets, for the help screen (they are not App bindings).
OTHER_KEYS: list[tuple[str, str]] = [
    ("↑ ↓", "move in the instances table (the detail pane and log follow), the grid, a pane"),
    ("← →", "in the node grid: the next cell (it scrolls sideways past the last column)"),
    ("PgUp PgDn", "a page up / down in the focused table or pane"),
    ("Tab Shift+Tab", "next / previous pane (table, node grid, log, events)"),
    ("Ctrl+P", "Textual's command palette (themes, keys, quit)"),
    ("Enter", "in the node grid: select that instance"),
    ("Esc", "leave the full-screen log · discard a pending recipe edit"),
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
    Binding(
        "escape",
        "escape",
        "Clear search",
        show=False,
        key_display="Esc",
        tooltip="In the log: clear the search (again: leave the full-screen log)",
    ),
]
# The log's keys as the help screen lists them.
OTHER_KEYS += [
    (binding.key_display or binding.key, binding.tooltip or binding.description)
    for binding in LOG_BINDINGS
    if isinstance(binding, Binding)
]


def help_keys(
    bindings: Iterable[BindingType], other: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """(key, what it does) for the help screen: the App's bindings, then every widget's
    (the tables above), then the keys Textual's widgets handle (`other`)."""
    keys: list[tuple[str, str]] = []
    seen: set[str] = set()
    tables = [bindings, TABLE_BINDINGS, FILTER_BINDINGS, CONFIRM_BINDINGS, HELP_BINDINGS]
    for table in tables:
        for binding in table:
            assert isinstance(binding, Binding)
            if binding.key in ("escape", "ctrl+q") and table is bindings:
                continue  # the App's Esc is listed with the other keys; ctrl+q is q
            shown = binding.key_display or binding.key
            if shown in seen:
                continue
            seen.add(shown)
            keys.append((shown, binding.tooltip or binding.description))
    return keys + list(other)
