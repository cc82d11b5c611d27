"""The instances table's incremental order and filter (`viewmodel.table.RowIndex`): a
changed row moves to its place, and what it shows always equals a full sort and filter."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from srtr.tui import viewmodel as vm
from srtr.tui.viewmodel.rows import SORT_KEYS
from srtr.tui.viewmodel.rowset import Rows
from srtr.tui.viewmodel.table import RowIndex
from tests.tui.test_viewmodel import NOW, inst, state

PHASES = ("Pending", "Starting", "Running", "Ready", "BackOff", "Failed", "Lost")
NODE = vm.COLUMN_KEYS.index("node")
RESTARTS = vm.COLUMN_KEYS.index("restarts")
PHASE = vm.COLUMN_KEYS.index("phase")


def docs(count: int) -> list[dict[str, Any]]:
    return [
        inst(f"i{n}", node=f"node{n % 7}", service=("train", "watch")[n % 2], restarts=n % 3)
        for n in range(count)
    ]


def full(rows: dict[str, vm.InstanceRow], index: RowIndex) -> list[str]:
    """What a table shows computed from scratch: filter, then sort."""
    return vm.ordered(vm.filtered(rows, index.filter), index.column, index.reverse)


def test_a_change_to_one_instance_updates_its_row_and_its_place() -> None:
    items = docs(6)
    rows = vm.instance_rows(items, NOW)
    index = RowIndex()
    index.replace(rows)
    index.sort(RESTARTS, reverse=False)
    assert index.names() == ["i0", "i3", "i1", "i4", "i2", "i5"]
    items[0] = {**items[0], "restarts": 9, "phase": "BackOff"}
    rows = {**rows, "i0": vm.instance_row(items[0], NOW)}
    index.update(rows, ["i0"])
    assert index.names()[-1] == "i0"  # most restarts: last
    assert index.rows["i0"].cells[PHASE] == "BackOff"
    assert index.position("i0") == 5
    index.sort(RESTARTS, reverse=True)
    assert index.name_at(0) == "i0" and index.position("i0") == 0
    index.set_filter(vm.Filter.parse("phase=backoff"))
    assert index.names() == ["i0"] and index.position("i3") is None
    items[3] = {**items[3], "phase": "BackOff"}
    index.update({**rows, "i3": vm.instance_row(items[3], NOW)}, ["i3"])
    assert index.names() == ["i0", "i3"]  # a row the filter now lets through appears


def test_a_frame_rebuilds_only_the_rows_whose_document_changed() -> None:
    items = docs(4)
    first = vm.frame(state(items), NOW)
    # Time passing alone (ages tick) changes no row: AGE is drawn from `started`.
    later = vm.frame(state([dict(d) for d in items]), NOW + 60, previous=first)
    assert later.changed == frozenset()
    assert later.rows["i1"] is first.rows["i1"]
    assert later.rows["i1"].started == NOW - 30
    items[2] = {**items[2], "phase": "Failed"}
    third = vm.frame(state(items), NOW + 61, previous=later)
    assert third.changed == {"i2"}
    assert third.rows["i2"].cells[PHASE] == "Failed"
    # The same snapshot again: the header ticks, nothing else is rebuilt.
    again = vm.frame(third.state or {}, NOW + 62, previous=third)
    assert again.rows is third.rows and again.changed == frozenset()
    assert again.header.elapsed != third.header.elapsed or again.header is not third.header


FILTERS = ("", "watch", "!watch", "phase=fail", "node=node3", "node:node1 !phase=ready", "i1")
change = st.tuples(
    st.integers(0, 29),
    st.sampled_from(PHASES),
    st.integers(0, 4),
    st.integers(0, 9),
)


@settings(max_examples=150, deadline=None)
@given(
    column=st.sampled_from([None, *range(len(vm.COLUMNS))]),
    reverse=st.booleans(),
    flt=st.sampled_from(FILTERS),
    changes=st.lists(st.lists(change, max_size=6), max_size=6),
    later_flt=st.sampled_from(FILTERS),
)
def test_what_the_index_shows_equals_a_full_sort_and_filter(
    column: int | None,
    reverse: bool,
    flt: str,
    changes: list[list[tuple[int, str, int, int]]],
    later_flt: str,
) -> None:
    items = docs(30)
    rows = vm.instance_rows(items, NOW)
    index = RowIndex()
    index.replace(rows)
    index.sort(column, reverse)
    index.set_filter(vm.Filter.parse(flt))
    assert index.names() == full(rows, index)
    for batch in changes:
        rows = dict(rows)
        for n, phase, restarts, node in batch:
            items[n] = {**items[n], "phase": phase, "restarts": restarts, "node": f"node{node}"}
            rows[f"i{n}"] = vm.instance_row(items[n], NOW)
        index.update(rows, {f"i{n}" for n, *_ in batch})
        shown = index.names()
        assert shown == full(rows, index)
        assert all(index.position(name) == i for i, name in enumerate(shown))
    index.set_filter(vm.Filter.parse(later_flt))
    index.sort(column, not reverse)
    assert index.names() == full(rows, index)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 11), st.sampled_from(PHASES), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_a_frame_told_what_changed_equals_one_built_from_scratch(
    edits: list[tuple[int, str, bool]],
) -> None:
    """The reader names the instances that changed (`changed`): the frame built from that
    alone shows what a frame built from the whole state shows."""
    items = docs(12)
    built = vm.frame(state(items), NOW)
    vm.warm(built)
    for at, phase, ready in edits:
        items = list(items)
        items[at] = {**items[at], "phase": phase, "ready": ready}
        told = vm.frame(state(items), NOW, previous=built, changed=frozenset({f"i{at}"}))
        fresh = vm.frame(state(items), NOW)
        assert told.changed == {f"i{at}"}
        assert {n: r.cells for n, r in told.rows.items()} == {
            n: r.cells for n, r in fresh.rows.items()
        }
        assert told.pools == fresh.pools and told.others == fresh.others
        assert dict(told.grid.rows) == dict(fresh.grid.rows)
        assert told.header == fresh.header
        built = told


@settings(max_examples=100, deadline=None)
@given(
    column=st.sampled_from(range(len(vm.COLUMNS))),
    reverse=st.booleans(),
    edits=st.lists(
        st.tuples(
            st.integers(0, 29),
            st.sampled_from(PHASES),
            st.integers(0, 4),
            st.one_of(st.none(), st.integers(-9, 200)),
            st.one_of(st.none(), st.floats(NOW - 1e5, NOW)),
            st.booleans(),
        ),
        max_size=12,
    ),
)
def test_a_sort_reads_the_documents_and_builds_no_row(
    column: int, reverse: bool, edits: list[tuple[int, str, int, int | None, float | None, bool]]
) -> None:
    """A sort keystroke on rows not built yet (`rowset.Rows`: 80,000 of them right after a
    snapshot) takes each row's value from its document (`rows.SORT_KEYS`): the same order as
    the rows' own sort values, and not one row built for it."""
    items = docs(30)
    for n, phase, restarts, code, started, ready in edits:
        items[n] = {
            **items[n],
            "phase": phase,
            "restarts": restarts,
            "exit_code": code,
            "started_at": started,
            "ready": ready,
        }
    for item in items:
        built = vm.instance_row(item, NOW)
        assert built.sort == tuple(key(item) for key in SORT_KEYS)
    lazy = Rows({str(i["name"]): i for i in items}, NOW)
    index = RowIndex()
    index.replace(lazy)
    index.sort(column, reverse)
    assert not lazy.warmed and len(lazy.every()) == len(items)
    assert index.names() == full(vm.instance_rows(items, NOW), index)
