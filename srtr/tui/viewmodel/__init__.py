"""Pure view-model of the TUI: a state.json snapshot (plain dicts) in, display data out.

Every decision about what the TUI shows lives here, so it is tested without Textual. Nothing
here reads a file or a clock: callers pass `now` (wall seconds), which keeps snapshot tests
deterministic. Colours are Rich style names; widgets only apply them. The snapshot's fields
are modelled in `srtr.store.rundir`; the phases are the store's own enums.

One module per part of the screen, all re-exported here:

- `phases`: colour, glyph and short word per phase, severity (the most alarming wins);
- `text`: ages (`3m7s`) and exits (`143 (SIGTERM)`);
- `header`: the job header (`gen 7/6`, elapsed, time left);
- `rows`: instance table rows, how they diff, sort keys and the `/` filter;
- `pools` and `grid`: the pools panel (`train 2/2 ready`) and the node grid;
- `detail`: the selected instance's detail pane;
- `events`: event lines; `panels`: teardown tiers and a live recipe edit;
- `frame`: all of the above for one snapshot, with its differences from the last one;
- `logs`: where a log splits at its last restart marker, long lines, and the log view's
  lines, search and rows (`LogLines`).
"""

from __future__ import annotations

from srtr.store.status import ALIVE as ALIVE_PHASES
from srtr.store.status import JOB_ENDED
from srtr.tui.viewmodel.detail import DetailView, detail, remember_probe_failures
from srtr.tui.viewmodel.events import EventLine, event_lines
from srtr.tui.viewmodel.frame import Frame, frame, warm, warmed
from srtr.tui.viewmodel.grid import (
    EMPTY_CELL,
    GridCell,
    NodeGrid,
    column_label,
    diff_grid,
    node_grid,
)
from srtr.tui.viewmodel.header import HeaderView, header
from srtr.tui.viewmodel.logs import (
    LONG_LINE,
    LogLines,
    Search,
    display_lines,
    is_restart_marker,
    match_spans,
    search_pattern,
    split_at_last_marker,
    text_width,
)
from srtr.tui.viewmodel.panels import PlanView, Stopping, TierView, plan_view, teardown
from srtr.tui.viewmodel.phases import (
    JOB_PHASE_STYLE,
    PHASE_GLYPH,
    PHASE_SHORT,
    PHASE_STYLE,
    Doc,
    phase_style,
)
from srtr.tui.viewmodel.pools import PoolView, ServiceCount, other_services, pools
from srtr.tui.viewmodel.rows import (
    COLUMN_KEYS,
    COLUMNS,
    PHASE_COLUMN,
    Filter,
    InstanceRow,
    RowDiff,
    diff_rows,
    filtered,
    instance_row,
    instance_rows,
    ordered,
    sort_changed,
    worst_doc,
    worst_instance,
)
from srtr.tui.viewmodel.text import age_since, end_cut, fmt_age, fmt_exit, last_exit, middle_cut

__all__ = [
    "ALIVE_PHASES",
    "COLUMNS",
    "COLUMN_KEYS",
    "EMPTY_CELL",
    "JOB_ENDED",
    "JOB_PHASE_STYLE",
    "LONG_LINE",
    "PHASE_COLUMN",
    "PHASE_GLYPH",
    "PHASE_SHORT",
    "PHASE_STYLE",
    "DetailView",
    "Doc",
    "EventLine",
    "Filter",
    "Frame",
    "GridCell",
    "HeaderView",
    "InstanceRow",
    "LogLines",
    "NodeGrid",
    "PlanView",
    "PoolView",
    "RowDiff",
    "Search",
    "ServiceCount",
    "Stopping",
    "TierView",
    "age_since",
    "column_label",
    "detail",
    "diff_grid",
    "diff_rows",
    "display_lines",
    "end_cut",
    "event_lines",
    "filtered",
    "fmt_age",
    "fmt_exit",
    "frame",
    "header",
    "instance_row",
    "instance_rows",
    "is_restart_marker",
    "last_exit",
    "match_spans",
    "middle_cut",
    "node_grid",
    "ordered",
    "other_services",
    "phase_style",
    "plan_view",
    "pools",
    "remember_probe_failures",
    "search_pattern",
    "sort_changed",
    "split_at_last_marker",
    "teardown",
    "text_width",
    "warm",
    "warmed",
    "worst_doc",
    "worst_instance",
]
