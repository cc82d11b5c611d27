"""The instances table: one row per instance, how rows change between snapshots, sort keys
(natural order for node names) and the `/` filter language.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from srtr.store.rundir import ready_now
from srtr.tui.viewmodel.phases import SEVERITY, Doc
from srtr.tui.viewmodel.text import age_since, attempt_end, last_exit

# NAME, PHASE and READY first (as k9s does): on an 80-column terminal they stay on screen,
# and the rest scrolls sideways.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "NAME"),
    ("phase", "PHASE"),
    ("ready", "READY"),
    ("restarts", "RESTARTS"),
    ("age", "AGE"),
    ("exit", "LAST EXIT"),
    ("node", "NODE"),
    ("ip", "IP"),
    ("service", "SERVICE"),
    ("kind", "KIND"),
)
COLUMN_KEYS: tuple[str, ...] = tuple(key for key, _ in COLUMNS)
# `instance_row` builds its tuples in this order.
assert COLUMN_KEYS == (
    "name",
    "phase",
    "ready",
    "restarts",
    "age",
    "exit",
    "node",
    "ip",
    "service",
    "kind",
)
PHASE_COLUMN = COLUMN_KEYS.index("phase")


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One table row: display cells in COLUMNS order, and raw values to sort by."""

    name: str
    cells: tuple[str, ...]
    sort: tuple[Any, ...]
    # When the AGE cell counts from and to (wall seconds): a table shows it live from these.
    started: float | None = None
    ended: float | None = None
    # The cells in lower case, and all of them in one string, for the filter to match fast.
    lower: tuple[str, ...] = ()
    haystack: str = ""

    @property
    def phase(self) -> str:
        return self.cells[PHASE_COLUMN]


# Each column's sort value, from an instance's document: a row's `sort`, and what a sort
# keystroke reads for rows not built yet (`rowset.Rows.sort_values`: 80,000 rows need not
# be built for it). Unknown values sort last whatever the direction of the other values.


def _name(inst: Doc) -> Any:
    return str(inst["name"])


def _phase(inst: Doc) -> Any:
    phase = str(inst.get("phase", ""))
    return (SEVERITY.get(phase, 10), phase)


def _restarts(inst: Doc) -> Any:
    return int(inst.get("restarts", 0) or 0)


def _age(inst: Doc) -> Any:
    started = inst.get("started_at")
    return (started is None, -(started or 0.0))  # youngest first, like k9s AGE ascending


def _exit(inst: Doc) -> Any:
    code = inst.get("exit_code")
    return (code is None, code or 0)


def _field(key: str, natural: bool = False) -> Callable[[Doc], Any]:
    def value(inst: Doc) -> Any:
        text = str(inst.get(key, ""))
        return _natural(text) if natural else text

    return value


SORT_KEYS: tuple[Callable[[Doc], Any], ...] = (
    _name,
    _phase,
    ready_now,
    _restarts,
    _age,
    _exit,
    _field("node", natural=True),
    _field("node_ip", natural=True),
    _field("service"),
    _field("kind"),
)
assert len(SORT_KEYS) == len(COLUMN_KEYS)


def instance_row(inst: Doc, now: float) -> InstanceRow:
    # Built for every instance of a new snapshot (80,000 in a large job): tuples in
    # COLUMNS order straight away, each value computed once.
    name = str(inst["name"])
    service, kind = str(inst.get("service", "")), str(inst.get("kind", ""))
    node, ip = str(inst.get("node", "")), str(inst.get("node_ip", ""))
    phase = str(inst.get("phase", ""))
    ready = ready_now(inst)
    restarts = inst.get("restarts", 0)
    started = inst.get("started_at")
    ended = attempt_end(inst)
    cells = (
        name,
        phase,
        "yes" if ready else "no",
        str(restarts),
        age_since(started, ended or now),
        last_exit(inst, short=True),
        node,
        ip,
        service,
        kind,
    )
    code = inst.get("exit_code")
    # SORT_KEYS' values (tests check that they are), from the values read above: the
    # functions' own reads would cost a third of a row.
    sort = (
        name,
        (SEVERITY.get(phase, 10), phase),
        ready,
        int(restarts or 0),
        (started is None, -(started or 0.0)),
        (code is None, code or 0),
        _natural(node),
        _natural(ip),
        service,
        kind,
    )
    haystack = "\x00".join(cells).lower()
    return InstanceRow(
        name=name,
        cells=cells,
        sort=sort,
        started=started,
        ended=ended,
        lower=tuple(haystack.split("\x00")),
        haystack=haystack,
    )


def instance_rows(instances: Iterable[Doc], now: float) -> dict[str, InstanceRow]:
    """Rows keyed by instance name, in state order (the default order of the table)."""
    return {str(i["name"]): instance_row(i, now) for i in instances}


_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)  # the instances of a node share its name and IP
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
    """The names of `rows` in table order: by `column` (equal values in state order), the
    whole list backwards when `reverse`; state order without a column."""
    keys = list(rows)
    if column is not None:
        keys.sort(key=lambda k: rows[k].sort[column])
    return keys[::-1] if reverse else keys


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
        lower = row.lower or tuple(cell.lower() for cell in row.cells)
        for negate, column, needle in self.terms:
            if column is None:
                # Cells are joined by NUL, which no term holds: a hit lies within one cell.
                hit = needle in (row.haystack or "\x00".join(lower))
            else:
                hit = needle in lower[column]
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


FAILED_PHASES = frozenset({"Failed", "Lost"})


def worst_instance(rows: Iterable[InstanceRow]) -> str | None:
    """The instance to look at first when a job has ended: the first Failed (or Lost) one,
    in state order; None when none failed."""
    return _worst((row.name, row.phase) for row in rows)


def worst_doc(instances: Iterable[Doc]) -> str | None:
    """`worst_instance` read from the instances' documents (no row built for it)."""
    return _worst((str(inst["name"]), str(inst.get("phase", ""))) for inst in instances)


def _worst(phases: Iterable[tuple[str, str]]) -> str | None:
    worst: tuple[str, str] | None = None
    for name, phase in phases:
        if phase not in FAILED_PHASES:
            continue
        if worst is None or SEVERITY.get(phase, 0) > SEVERITY.get(worst[1], 0):
            worst = (name, phase)
    return None if worst is None else worst[0]
