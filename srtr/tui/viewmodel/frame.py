"""One frame: everything the main screen shows of one snapshot at one instant, with its
differences from the previous frame, built off the UI thread.

A frame of 80,000 instances costs what changed, not what exists: rows and node-grid rows are
built when first read (`rowset.Rows`, `grid.GridRows`: the page on screen), and a snapshot
whose changed instances the reader knows (`changed`, from `StateFollower`) rebuilds those
instances' rows, their nodes' grid rows and the pool counts they move, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from srtr.store.status import JOB_ENDED, JobPhase
from srtr.tui.viewmodel.grid import GridCell, GridChanges, NodeGrid, node_grid
from srtr.tui.viewmodel.header import HeaderView, header
from srtr.tui.viewmodel.panels import PlanView, TierView, plan_view, teardown
from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.pools import PoolView, ServiceCount, other_services, pools
from srtr.tui.viewmodel.rows import InstanceRow
from srtr.tui.viewmodel.rowset import Rows, text_widths
from srtr.tui.viewmodel.tally import Tally


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything the main screen shows that derives from one snapshot at one instant.

    `changed` and `grid_changes` are the differences from the previous frame (None: start
    over), computed where the frame is built (a worker thread), so the UI's work per frame
    is proportional to what changed, not to 80,000 rows; the grid's cells only when read
    (`GridChanges`: the grid's widget draws its page from the grid itself).
    """

    header: HeaderView
    rows: Mapping[str, InstanceRow]
    pools: list[PoolView]
    others: list[ServiceCount]
    grid: NodeGrid
    teardown: list[TierView] | None
    plan: PlanView | None
    instances: dict[str, Doc]  # by name, for the detail pane
    changed: frozenset[str] | None = None
    grid_changes: Sequence[tuple[str, int, GridCell]] | None = None
    state: Doc | None = None  # the snapshot this frame shows (a new one: rows may change)
    # The widest text of each column that follows its text (`rowset.text_widths`).
    widths: tuple[int, ...] = ()
    # The instances whose probe fails a stage gate (the header counts down the nearest).
    gated: frozenset[str] = frozenset()
    positions: Mapping[str, int] = field(default_factory=dict)  # in state.json's instances
    tally: Tally = field(default_factory=Tally)  # the pools panel's counts

    @property
    def ended(self) -> bool:
        return self.header.phase in JOB_ENDED or self.header.controller_gone

    @property
    def tearing_down(self) -> bool:
        return self.header.phase == JobPhase.TEARING_DOWN


def frame(
    state: Doc,
    now: float,
    *,
    controller_alive: bool = True,
    previous: Frame | None = None,
    changed: frozenset[str] | None = None,
) -> Frame:
    """Build the frame for `state` at `now`, and its differences from `previous`.

    `changed`: the instances whose documents differ from `previous.state`'s, when the
    caller knows (the same names otherwise): only those are looked at. Without it rows are
    built again only for instances whose document changed. A row's AGE is shown live from
    its `started`/`ended`, so time passing changes no row: the same snapshot again (ages
    tick) rebuilds only the header and the teardown panel.
    """
    tiers = teardown(state, now)
    if previous is not None and previous.state is state:
        head = _header(state, now, controller_alive, previous.instances, previous.gated)
        return replace(previous, header=head, teardown=tiers, changed=frozenset(), grid_changes=[])
    if previous is not None and previous.state is not None and changed is not None:
        known = _known(state, now, previous, changed)
        if known is not None:
            head = _header(state, now, controller_alive, known.instances, known.gated)
            return replace(known, header=head, teardown=tiers)
    docs = state.get("instances", [])
    instances = {str(i["name"]): i for i in docs}
    rows, names = _rows(instances, now, previous)
    grid, touched = _grid(state, instances, names, previous)
    positions = {name: at for at, name in enumerate(instances)}
    grid_changes: GridChanges | None = None
    if previous is not None:
        old = previous.grid
        if old.columns == grid.columns and old.rows.keys() == grid.rows.keys():
            # Only the rows of the changed instances' nodes can differ (a state read whole
            # compared by name): not 10,000 rows built twice to find the few.
            grid_changes = GridChanges(old.rows, grid.rows, touched)
    gated = frozenset(_gated(instances, instances))
    tally = Tally.of(docs)
    return Frame(
        header=_header(state, now, controller_alive, instances, gated),
        rows=rows,
        pools=pools(state, tally),
        others=other_services(state, tally),
        grid=grid,
        teardown=tiers,
        plan=plan_view(state),
        instances=instances,
        changed=names,
        grid_changes=grid_changes,
        state=state,
        widths=text_widths(docs),
        gated=gated,
        positions=positions,
        tally=tally,
    )


def _header(
    state: Doc, now: float, alive: bool, instances: Mapping[str, Doc], gated: Iterable[str]
) -> HeaderView:
    return header(state, now, controller_alive=alive, gate_candidates=[instances[n] for n in gated])


def _gated(instances: Mapping[str, Doc], names: Iterable[str]) -> Iterable[str]:
    """Those of `names` whose probe fails a stage gate."""
    for name in names:
        inst = instances[name]
        if inst.get("probe_gate") and inst.get("probe_message"):
            yield name


def _known(state: Doc, now: float, previous: Frame, changed: frozenset[str]) -> Frame | None:
    """The frame of `state`, whose instances differ from `previous.state`'s only in
    `changed` (same names, same order): built from `previous`, at the cost of `changed`.
    None when a changed instance is new, or moved to another node (build it all again)."""
    old = previous.instances
    docs = state.get("instances", [])
    if len(docs) != len(old):
        return None
    by_name: dict[str, Doc] = {}
    for name in changed:
        at = previous.positions.get(name)
        if at is None or str(docs[at].get("name")) != name:
            return None
        by_name[name] = docs[at]
    instances = {**old, **by_name}
    touched = _touched(state, instances, by_name, previous)
    if touched is None:
        return None
    rows = previous.rows
    rows = rows.updated(instances, changed, now) if isinstance(rows, Rows) else Rows(instances, now)
    for name in changed:
        # Built now, a few per change, rather than all at once when the job settles: that
        # would be seconds of the process's time just when it should be idle.
        rows[name]
    grid = node_grid(state, previous.grid, touched, instances)
    gated = (previous.gated - changed) | frozenset(_gated(instances, changed))
    tally = previous.tally.moved((old[n] for n in by_name), by_name.values())
    return replace(
        previous,
        rows=rows,
        pools=pools(state, tally),
        others=other_services(state, tally),
        tally=tally,
        grid=grid,
        plan=plan_view(state),
        instances=instances,
        changed=changed,
        grid_changes=GridChanges(previous.grid.rows, grid.rows, touched),
        state=state,
        widths=text_widths(by_name.values(), previous.widths),
        gated=gated,
    )


def _grid(
    state: Doc, instances: dict[str, Doc], changed: frozenset[str] | None, previous: Frame | None
) -> tuple[NodeGrid, set[str] | None]:
    """The node grid, built again only for the nodes of changed instances when the nodes
    and where each instance runs are as in `previous`; and those nodes (None: all)."""
    touched = None
    if previous is not None and changed is not None:
        touched = _touched(state, instances, changed, previous)
    if previous is None or touched is None:
        return node_grid(state, instances=instances), None
    return node_grid(state, previous.grid, touched, instances), touched


def _touched(
    state: Doc, instances: Mapping[str, Doc], names: Iterable[str], previous: Frame
) -> set[str] | None:
    """The nodes of `names` (a grid built from `previous`'s again only there); None when
    one of them moved to another node or the nodes are not `previous`'s (build it all)."""
    touched: set[str] = set()
    for name in names:
        node = str(instances[name].get("node", ""))
        if node != str(previous.instances[name].get("node", "")):
            return None
        touched.add(node)
    if [str(n["name"]) for n in state.get("nodes", [])] != list(previous.grid.rows):
        return None
    return touched


def _rows(
    instances: dict[str, Doc], now: float, previous: Frame | None
) -> tuple[Rows, frozenset[str] | None]:
    """The rows of `instances`, keeping `previous`'s for unchanged documents, and the names
    whose row changed (None when the instance set changed: a table starts over)."""
    if previous is None or not isinstance(previous.rows, Rows):
        return Rows(instances, now), None
    old_docs = previous.instances
    if list(old_docs) != list(instances):
        return Rows(instances, now), None
    changed = frozenset(n for n, doc in instances.items() if not _same(old_docs[n], doc))
    return previous.rows.updated(instances, changed, now), changed


def warm(built: Frame) -> None:
    """Build the rows a frame built lazily (`Rows.warm`), for a sort or a filter to read."""
    if isinstance(built.rows, Rows):
        built.rows.warm()


def warmed(built: Frame) -> bool:
    """Every row of `built` is built (`warm` has nothing left to do)."""
    return not isinstance(built.rows, Rows) or built.rows.warmed


def _same(before: Doc, after: Doc) -> bool:
    # The follower's copies share unchanged records: most are the very same object, which
    # `==` on two dicts would still walk key by key.
    return before is after or before == after
