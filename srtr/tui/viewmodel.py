"""Pure view-model of the TUI: a state.json snapshot (plain dicts) in, display data out.

Every decision about what the TUI shows lives here, so it is tested without Textual: table
rows and how they diff, the filter language, sort keys, pool and rider summaries
(`train 2/2 ready`), node-grid cells, the header (`gen 7/6`, elapsed), the teardown tiers
with their remaining grace, event lines, and where a log splits at its last restart
marker. Nothing here reads a file or a clock: callers pass `now` (wall seconds), which
keeps snapshot tests deterministic. Colours are Rich style names; widgets only apply them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hostlist

Doc = Mapping[str, Any]

# -- phases ---------------------------------------------------------------------------------

PHASE_STYLE: dict[str, str] = {
    "Pending": "grey62",
    "Starting": "yellow",
    "Running": "cyan",
    "Ready": "green",
    "BackOff": "dark_orange",
    "Terminating": "magenta",
    "Succeeded": "blue",
    "Failed": "bold red",
    "Stopped": "grey50",
    "Lost": "bold red",
}
PHASE_GLYPH: dict[str, str] = {
    "Pending": "○",
    "Starting": "◔",
    "Running": "◑",
    "Ready": "●",
    "BackOff": "↻",
    "Terminating": "◌",
    "Succeeded": "✓",
    "Failed": "✗",
    "Stopped": "■",
    "Lost": "?",
}
# The node grid is narrow: one short word per cell.
PHASE_SHORT: dict[str, str] = {
    "Pending": "Pend",
    "Starting": "Start",
    "Running": "Run",
    "Ready": "Ready",
    "BackOff": "BackOff",
    "Terminating": "Term",
    "Succeeded": "Done",
    "Failed": "Failed",
    "Stopped": "Stop",
    "Lost": "Lost",
}
JOB_PHASE_STYLE: dict[str, str] = {
    "Pending": "grey62",
    "Launching": "yellow",
    "Running": "green",
    "TearingDown": "magenta",
    "Succeeded": "blue",
    "Failed": "bold red",
}
ALIVE_PHASES = frozenset({"Starting", "Running", "Ready", "Terminating"})
JOB_ENDED = frozenset({"Succeeded", "Failed"})
# A cell that holds several instances shows the most alarming one: that is what a user
# scanning 1,024 rows must not miss.
_SEVERITY = {
    "Failed": 9,
    "Lost": 8,
    "BackOff": 7,
    "Terminating": 6,
    "Starting": 5,
    "Pending": 4,
    "Running": 3,
    "Ready": 2,
    "Stopped": 1,
    "Succeeded": 0,
}
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def phase_style(phase: str) -> str:
    return PHASE_STYLE.get(phase, "")


# -- time -----------------------------------------------------------------------------------


def fmt_age(seconds: float | None) -> str:
    """Age as kubectl prints it: `42s`, `3m7s`, `17m`, `4h12m`, `30h`, `3d4h`, `12d`.

    Coarser with age, which also means an old instance's cell rarely changes: at 4,096
    instances the table is not rewritten every second.
    """
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    minutes, hours = s // 60, s // 3600
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    return f"{hours // 24}d"


def age_since(at: float | None, now: float) -> str:
    return "" if at is None else fmt_age(now - at)


def fmt_exit(code: int | None, signal: int | None = None, *, short: bool = False) -> str:
    """`0`, `3`, `143 (SIGTERM)` (short: `143 SIGTERM`); '' when it has not exited."""
    if code is None and signal is None:
        return ""
    if signal:
        name = _SIGNALS.get(signal, f"signal {signal}")
        if code is None:
            return name
        return f"{code} {name}" if short else f"{code} ({name})"
    return str(code)


# -- header ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeaderView:
    name: str
    backend: str
    slurm_job_id: str
    phase: str
    generation: str  # "gen 7/6": desired / observed
    elapsed: str
    time_left: str  # '' when not on SLURM; '?' when SLURM has not told us yet
    stage: str
    reason: str
    controller_gone: bool

    @property
    def phase_style(self) -> str:
        return JOB_PHASE_STYLE.get(self.phase, "")


def header(state: Doc, now: float, *, controller_alive: bool = True) -> HeaderView:
    job = state.get("job", {})
    started = job.get("started_at")
    ended = job.get("ended_at")
    elapsed = "" if started is None else fmt_age((ended if ended is not None else now) - started)
    backend = str(job.get("backend", "?"))
    # `job.end_time` (wall seconds) is when the SLURM allocation ends, once known.
    end_time = job.get("end_time")
    if end_time is not None:
        time_left = fmt_age(end_time - now)
    else:
        time_left = "?" if backend == "slurm" else ""
    stages = job.get("stages") or []
    stage_index = job.get("stage")
    stage = ""
    if stages and isinstance(stage_index, int):
        shown = min(stage_index + 1, len(stages))
        current = stages[min(stage_index, len(stages) - 1)]
        stage = f"stage {shown}/{len(stages)} {current}"
    phase = str(job.get("phase", "?"))
    return HeaderView(
        name=str(job.get("name", "?")),
        backend=backend,
        slurm_job_id=str(job.get("slurm_job_id") or "—"),
        phase=phase,
        generation=f"gen {job.get('generation', '?')}/{job.get('observed_generation', '?')}",
        elapsed=elapsed,
        time_left=time_left,
        stage=stage,
        reason=str(job.get("reason") or ""),
        controller_gone=not controller_alive and phase not in JOB_ENDED,
    )


# -- instances table ------------------------------------------------------------------------

COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "NAME"),
    ("service", "SERVICE"),
    ("kind", "KIND"),
    ("node", "NODE"),
    ("ip", "IP"),
    ("phase", "PHASE"),
    ("ready", "READY"),
    ("restarts", "RESTARTS"),
    ("age", "AGE"),
    ("exit", "LAST EXIT"),
)
COLUMN_KEYS: tuple[str, ...] = tuple(key for key, _ in COLUMNS)
PHASE_COLUMN = COLUMN_KEYS.index("phase")


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One table row: display cells in COLUMNS order, and raw values to sort by."""

    name: str
    cells: tuple[str, ...]
    sort: tuple[Any, ...]

    @property
    def phase(self) -> str:
        return self.cells[PHASE_COLUMN]


def last_exit(inst: Doc, *, short: bool = False) -> str:
    history = inst.get("history") or []
    if history:
        last = history[-1]
        return fmt_exit(last.get("exit_code"), last.get("signal"), short=short)
    return fmt_exit(inst.get("exit_code"), short=short)


def instance_row(inst: Doc, now: float) -> InstanceRow:
    started = inst.get("started_at")
    exit_text = last_exit(inst, short=True)
    code = inst.get("exit_code")
    cells = (
        str(inst["name"]),
        str(inst.get("service", "")),
        str(inst.get("kind", "")),
        str(inst.get("node", "")),
        str(inst.get("node_ip", "")),
        str(inst.get("phase", "")),
        "yes" if _is_ready(inst) else "no",
        str(inst.get("restarts", 0)),
        age_since(started, now),
        exit_text,
    )
    # Unknown values sort last whatever the direction of the other values.
    sort = (
        cells[0],
        cells[1],
        cells[2],
        _natural(cells[3]),
        _natural(cells[4]),
        (_SEVERITY.get(cells[5], 10), cells[5]),
        _is_ready(inst),
        int(inst.get("restarts", 0) or 0),
        (started is None, -(started or 0.0)),  # youngest first, like k9s AGE ascending
        (code is None, code or 0),
    )
    return InstanceRow(name=cells[0], cells=cells, sort=sort)


def instance_rows(instances: Iterable[Doc], now: float) -> dict[str, InstanceRow]:
    """Rows keyed by instance name, in state order (the default order of the table)."""
    return {str(i["name"]): instance_row(i, now) for i in instances}


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> tuple[Any, ...]:
    """node2 < node10: compare digit runs as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(text))


@dataclass(frozen=True, slots=True)
class RowDiff:
    """What to do to a table showing `old` so that it shows `new`, cell by cell."""

    added: list[str]
    removed: list[str]
    changed: list[tuple[str, int, str]]  # (row key, column index, new text)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff_rows(old: Mapping[str, InstanceRow], new: Mapping[str, InstanceRow]) -> RowDiff:
    """Incremental update of a table: rows added/removed by name, and only changed cells."""
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    changed: list[tuple[str, int, str]] = []
    for key, row in new.items():
        before = old.get(key)
        if before is None or before.cells == row.cells:
            continue
        for index, (a, b) in enumerate(zip(before.cells, row.cells, strict=True)):
            if a != b:
                changed.append((key, index, b))
    return RowDiff(added, removed, changed)


def sort_changed(diff: RowDiff, column: int | None) -> bool:
    """Whether the table must be re-sorted after `diff` when sorted by `column`."""
    if column is None:
        return False
    return bool(diff.added) or any(c == column for _, c, _ in diff.changed)


def ordered(rows: Mapping[str, InstanceRow], column: int | None, reverse: bool) -> list[str]:
    if column is None:
        keys = list(rows)
        return keys[::-1] if reverse else keys
    return sorted(rows, key=lambda k: rows[k].sort[column], reverse=reverse)


# -- filter ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filter:
    """The `/` filter: whitespace-separated terms, all must match, case-insensitive.

    `term` matches a substring of any cell; `column=term` (or `column:term`) one column
    (`phase=fail`, `node:node1`); a leading `!` negates a term (`!Ready`).
    """

    terms: tuple[tuple[bool, int | None, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Filter:
        terms: list[tuple[bool, int | None, str]] = []
        for raw in text.split():
            negate = raw.startswith("!")
            body = raw[1:] if negate else raw
            column: int | None = None
            match = re.fullmatch(r"([a-z]+)[=:](.*)", body, flags=re.IGNORECASE)
            if match and match.group(1).lower() in _FILTER_COLUMNS:
                column = _FILTER_COLUMNS[match.group(1).lower()]
                body = match.group(2)
            if body or column is not None:
                terms.append((negate, column, body.lower()))
        return cls(tuple(terms))

    def __bool__(self) -> bool:
        return bool(self.terms)

    def matches(self, row: InstanceRow) -> bool:
        for negate, column, needle in self.terms:
            if column is None:
                hit = any(needle in cell.lower() for cell in row.cells)
            else:
                hit = needle in row.cells[column].lower()
            if hit == negate:
                return False
        return True


_FILTER_COLUMNS = {key: i for i, key in enumerate(COLUMN_KEYS)} | {
    "exit": COLUMN_KEYS.index("exit")
}


def filtered(rows: Mapping[str, InstanceRow], flt: Filter) -> dict[str, InstanceRow]:
    if not flt:
        return dict(rows)
    return {k: r for k, r in rows.items() if flt.matches(r)}


# -- pools ----------------------------------------------------------------------------------


def _is_ready(inst: Doc) -> bool:
    return bool(inst.get("ready")) and inst.get("phase") in ("Ready", "Running")


@dataclass(frozen=True, slots=True)
class ServiceCount:
    """A service (owner, rider or plain) with how many of its instances are ready."""

    name: str
    ready: int
    total: int
    worst: str  # the most alarming phase among its instances, for colour

    @property
    def text(self) -> str:
        return f"{self.name} {self.ready}/{self.total} ready"

    @property
    def style(self) -> str:
        if self.total and self.ready == self.total:
            return PHASE_STYLE["Ready"]
        return PHASE_STYLE.get(self.worst, "")


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    nodes: str  # compressed host list: node[2-1025]
    node_count: int
    owner: ServiceCount
    riders: tuple[ServiceCount, ...]


def _count(name: str, members: Sequence[Doc]) -> ServiceCount:
    worst = max(
        (str(i.get("phase", "")) for i in members), key=lambda p: _SEVERITY.get(p, 10), default=""
    )
    return ServiceCount(name, sum(1 for i in members if _is_ready(i)), len(members), worst)


def pools(state: Doc) -> list[PoolView]:
    """`train 2/2 ready` per pool, with its riders listed under it."""
    by_pool: dict[tuple[str, str, str], list[Doc]] = {}
    for inst in state.get("instances", []):
        if inst.get("pool"):
            key = (str(inst["pool"]), str(inst.get("kind")), str(inst.get("service")))
            by_pool.setdefault(key, []).append(inst)
    views = []
    for pool in state.get("pools", []):
        name = str(pool["name"])
        owners = by_pool.get((name, "owner", name), [])
        riders = tuple(
            _count(r, by_pool.get((name, "rider", r), [])) for r in pool.get("riders", [])
        )
        nodes = list(pool.get("nodes", []))
        views.append(
            PoolView(
                name=name,
                nodes=hostlist.collect_hostlist(nodes) if nodes else "",
                node_count=len(nodes),
                owner=_count(name, owners),
                riders=riders,
            )
        )
    return views


def other_services(state: Doc) -> list[ServiceCount]:
    """Services outside pools (engine workers, frontend, benchmark, plain services)."""
    groups: dict[str, list[Doc]] = {}
    for inst in state.get("instances", []):
        if not inst.get("pool"):
            groups.setdefault(str(inst.get("service")), []).append(inst)
    return [_count(name, members) for name, members in groups.items()]


# -- node grid ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GridCell:
    text: str
    phase: str
    instance: str | None  # the instance a click on the cell selects

    @property
    def style(self) -> str:
        return PHASE_STYLE.get(self.phase, "")


EMPTY_CELL = GridCell("", "", None)


@dataclass(frozen=True, slots=True)
class NodeGrid:
    """One row per node: its role, the owner (or other non-rider instances), one per rider."""

    columns: tuple[str, ...]  # after NODE and ROLE: "owner", then rider service names
    rows: dict[str, tuple[GridCell, ...]] = field(default_factory=dict)


def _cell(members: Sequence[Doc]) -> GridCell:
    if not members:
        return EMPTY_CELL
    worst = max(members, key=lambda i: _SEVERITY.get(str(i.get("phase")), 10))
    phase = str(worst.get("phase", ""))
    text = f"{PHASE_GLYPH.get(phase, ' ')} {PHASE_SHORT.get(phase, phase)}"
    if len(members) > 1:
        text += f" +{len(members) - 1}"
    return GridCell(text, phase, str(worst["name"]))


def node_grid(state: Doc) -> NodeGrid:
    riders: list[str] = []
    for pool in state.get("pools", []):
        for rider in pool.get("riders", []):
            if rider not in riders:
                riders.append(rider)
    owner_of: dict[str, list[Doc]] = {}
    rider_of: dict[tuple[str, str], list[Doc]] = {}
    for inst in state.get("instances", []):
        node = str(inst.get("node", ""))
        if inst.get("kind") == "rider":
            rider_of.setdefault((node, str(inst.get("service"))), []).append(inst)
        else:
            owner_of.setdefault(node, []).append(inst)
    rows: dict[str, tuple[GridCell, ...]] = {}
    for node in state.get("nodes", []):
        name = str(node["name"])
        role = GridCell(str(node.get("state", "")).removeprefix("pool:"), "", None)
        riders_cells = (_cell(rider_of.get((name, r), [])) for r in riders)
        rows[name] = (role, _cell(owner_of.get(name, [])), *riders_cells)
    return NodeGrid(("owner", *riders), rows)


def diff_grid(
    old: Mapping[str, tuple[GridCell, ...]], new: Mapping[str, tuple[GridCell, ...]]
) -> list[tuple[str, int, GridCell]]:
    """Changed grid cells, for nodes present in both (node sets change only on rebuild)."""
    out: list[tuple[str, int, GridCell]] = []
    for node, cells in new.items():
        before = old.get(node)
        if before is None or before == cells:
            continue
        out.extend(
            (node, i, c) for i, (a, c) in enumerate(zip(before, cells, strict=True)) if a != c
        )
    return out


# -- detail pane ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DetailView:
    title: str
    facts: list[tuple[str, str]]  # (label, value) lines about placement and status
    phase: str
    command: str
    env: list[tuple[str, str]]
    probe: str
    probe_state: str  # "passing", "failing: ...", "not ready yet", "" without a probe
    last_probe_failure: str
    history: list[str]
    conditions: list[str]
    events: list[str]  # this instance's recent events: the reasons behind restarts


def detail(
    inst: Doc,
    now: float,
    *,
    events: Sequence[Doc] = (),
    last_probe_failure: str = "",
) -> DetailView:
    name = str(inst["name"])
    kind = str(inst.get("kind", ""))
    where = f"{inst.get('node', '')} ({inst.get('node_ip', '')})"
    role = f"{kind} of pool {inst['pool']}" if inst.get("pool") else kind
    flags = [f"tier {inst.get('shutdown_tier', 0)}"]
    if inst.get("critical"):
        flags.append("critical")
    if inst.get("terminal"):
        flags.append("terminal")
    phase = str(inst.get("phase", ""))
    status = f"{phase} · ready {'yes' if inst.get('ready') else 'no'}"
    if inst.get("started_at") is not None:
        status += f" · up {age_since(inst.get('started_at'), now)}"
    if phase == "BackOff" and inst.get("next_start_at") is not None:
        status += f" · next start in {fmt_age(inst['next_start_at'] - now)}"
    if inst.get("stop_deadline") is not None:
        status += f" · SIGKILL in {fmt_age(inst['stop_deadline'] - now)}"
    process = f"pid {inst.get('pid') or '—'}"
    if inst.get("step"):
        process += f" · step {inst['step']}"
    process += f" · restarts {inst.get('restarts', 0)}"
    exit_text = last_exit(inst)
    if exit_text:
        process += f" · last exit {exit_text}"
    facts = [
        ("role", f"{role} · service {inst.get('service', '')}"),
        ("node", where),
        ("status", status),
        ("process", process),
        ("flags", " · ".join(flags)),
        ("log", str(inst.get("log", ""))),
    ]
    probe = inst.get("probe") or ""
    message = str(inst.get("probe_message") or "")
    if not probe:
        probe_state = ""
    elif message:
        probe_state = f"failing: {message}"
    elif inst.get("ready"):
        probe_state = f"passing (ready {age_since(inst.get('ready_at'), now)} ago)"
    else:
        probe_state = "not passed yet"
    history = [
        f"#{h.get('attempt', '?')} exit {fmt_exit(h.get('exit_code'), h.get('signal')) or '?'}"
        f" · {age_since(h.get('at'), now)} ago" + (f" · {h['message']}" if h.get("message") else "")
        for h in reversed(inst.get("history") or [])
    ]
    conditions = [
        f"{c.get('type')}={c.get('status')} {c.get('reason', '')}"
        + (f": {c['message']}" if c.get("message") else "")
        for c in inst.get("conditions") or []
    ]
    own = f"instance/{name}"
    recent = [
        f"{age_since(e.get('ts'), now)} ago {e.get('reason', '')}: {e.get('message', '')}"
        for e in reversed(events)
        if e.get("object") == own
    ][:8]
    return DetailView(
        title=name,
        facts=facts,
        phase=phase,
        command=shlex.join(str(a) for a in inst.get("command") or []),
        env=sorted((str(k), str(v)) for k, v in (inst.get("env") or {}).items()),
        probe=str(probe),
        probe_state=probe_state,
        last_probe_failure=message or last_probe_failure,
        history=history,
        conditions=conditions,
        events=recent,
    )


def remember_probe_failures(known: Mapping[str, str], instances: Iterable[Doc]) -> dict[str, str]:
    """The last probe failure of each instance: state.json clears it once the probe passes."""
    out = dict(known)
    for inst in instances:
        message = inst.get("probe_message")
        if message:
            out[str(inst["name"])] = str(message)
    return out


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventLine:
    age: str
    warning: bool
    reason: str
    object: str
    message: str


def event_lines(events: Sequence[Doc], now: float, limit: int = 200) -> list[EventLine]:
    """Newest first, at most `limit`."""
    out = []
    for e in reversed(events[-limit:] if limit else events):
        out.append(
            EventLine(
                age=age_since(e.get("ts"), now),
                warning=e.get("type") == "Warning",
                reason=str(e.get("reason", "")),
                object=str(e.get("object", "")),
                message=str(e.get("message", "")),
            )
        )
    return out


# -- teardown -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stopping:
    name: str
    phase: str
    remaining: str  # "12s left", "SIGKILL sent", "not signalled yet"


@dataclass(frozen=True, slots=True)
class TierView:
    tier: int
    status: str  # "done" | "stopping" | "waiting"
    total: int
    alive: int
    stopping: list[Stopping]


def teardown(state: Doc, now: float) -> list[TierView] | None:
    """Each tier, which of its instances are still stopping, and their remaining grace.

    None unless the job is tearing down (a finished job shows its tiers as done).
    """
    phase = state.get("job", {}).get("phase")
    if phase != "TearingDown":
        return None
    tiers: dict[int, list[Doc]] = {}
    for inst in state.get("instances", []):
        tiers.setdefault(int(inst.get("shutdown_tier", 0) or 0), []).append(inst)
    views = []
    for tier in sorted(tiers):
        members = tiers[tier]
        alive = [i for i in members if i.get("phase") in ALIVE_PHASES]
        signalled = [i for i in alive if i.get("phase") == "Terminating"]
        status = "done" if not alive else ("stopping" if signalled else "waiting")
        stopping = []
        for inst in sorted(
            alive, key=lambda i: (i.get("stop_deadline") is None, i.get("stop_deadline") or 0)
        ):
            deadline = inst.get("stop_deadline")
            if deadline is not None:
                remaining = f"{max(0.0, deadline - now):.0f}s left"
            elif inst.get("phase") == "Terminating":
                remaining = "SIGKILL sent"
            else:
                remaining = "not signalled yet"
            stopping.append(Stopping(str(inst["name"]), str(inst.get("phase")), remaining))
        views.append(TierView(tier, status, len(members), len(alive), stopping))
    return views


# -- live recipe edits --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanView:
    """A recipe edit waiting for `a` (apply) / Esc (discard), or one that was rejected."""

    pending: bool
    summary: str
    lines: list[tuple[str, str]]  # (style, text)


_PLAN_KINDS = (
    ("add", "+ add", "green"),
    ("remove", "- remove", "red"),
    ("restart", "↻ restart", "yellow"),
    ("hot", "~ in place", "cyan"),
)


def plan_view(state: Doc) -> PlanView | None:
    recipe = state.get("recipe") or {}
    pending = recipe.get("pending")
    if pending:
        lines = []
        for key, label, style in _PLAN_KINDS:
            for change in pending.get(key) or []:
                detail = f": {change['detail']}" if change.get("detail") else ""
                lines.append(
                    (style, f"{label} {change.get('name')} on {change.get('node')}{detail}")
                )
        lines += [("dim", note) for note in pending.get("notes") or []]
        return PlanView(True, str(pending.get("summary", "")), lines)
    rejected = recipe.get("rejected")
    if rejected:
        return PlanView(
            False,
            "recipe edit rejected: nothing running was touched",
            [("red", str(line)) for line in rejected],
        )
    return None


# -- one frame ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything the main screen shows that derives from one snapshot at one instant.

    `changed` and `grid_changes` are the differences from the previous frame (None: start
    over), computed where the frame is built (a worker thread), so the UI's work per frame
    is proportional to what changed, not to 4,096 rows.
    """

    header: HeaderView
    rows: dict[str, InstanceRow]
    pools: list[PoolView]
    others: list[ServiceCount]
    grid: NodeGrid
    teardown: list[TierView] | None
    plan: PlanView | None
    instances: dict[str, Doc]  # by name, for the detail pane
    changed: frozenset[str] | None = None
    grid_changes: list[tuple[str, int, GridCell]] | None = None

    @property
    def ended(self) -> bool:
        return self.header.phase in JOB_ENDED or self.header.controller_gone

    @property
    def tearing_down(self) -> bool:
        return self.header.phase == "TearingDown"


def frame(
    state: Doc, now: float, *, controller_alive: bool = True, previous: Frame | None = None
) -> Frame:
    """Build the frame for `state` at `now`, and its differences from `previous`."""
    instances = state.get("instances", [])
    rows = instance_rows(instances, now)
    grid = node_grid(state)
    changed: frozenset[str] | None = None
    grid_changes: list[tuple[str, int, GridCell]] | None = None
    if previous is not None:
        old = previous.rows
        if old.keys() == rows.keys():
            changed = frozenset(k for k, r in rows.items() if old[k].cells != r.cells)
        if previous.grid.columns == grid.columns and previous.grid.rows.keys() == grid.rows.keys():
            grid_changes = diff_grid(previous.grid.rows, grid.rows)
    return Frame(
        header=header(state, now, controller_alive=controller_alive),
        rows=rows,
        pools=pools(state),
        others=other_services(state),
        grid=grid,
        teardown=teardown(state, now),
        plan=plan_view(state),
        instances={str(i["name"]): i for i in instances},
        changed=changed,
        grid_changes=grid_changes,
    )


# -- logs -----------------------------------------------------------------------------------

# The backend appends this line before each restart. A crashed attempt may leave its last
# line without a newline, so the marker can end a line rather than start one.
MARKER = re.compile(r"==== srtr: (\S+) attempt (\d+) starting on (\S+) at (\S+) ====\r?$", re.M)
MARKER_PREFIX = b"==== srtr: "
LONG_LINE = 4096  # a longer line is shown as several display lines, so rendering stays cheap


def is_restart_marker(text: str) -> bool:
    """Whether `text` (a line, or the rest of one) is exactly a restart marker."""
    return MARKER.fullmatch(text.rstrip("\n")) is not None


def split_at_last_marker(text: str) -> tuple[str, str]:
    """(`before`, `after`): the log before the last restart, and the current attempt's.

    `after` starts with the marker itself; without a marker, everything is current.
    """
    last = None
    for last in MARKER.finditer(text):  # noqa: B007 - we want the last match
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
