"""One frame: everything the main screen shows of one snapshot at one instant, with its
differences from the previous frame, built off the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from srtr.store.status import JOB_ENDED, JobPhase
from srtr.tui.viewmodel.grid import GridCell, NodeGrid, diff_grid, node_grid
from srtr.tui.viewmodel.header import HeaderView, header
from srtr.tui.viewmodel.panels import PlanView, TierView, plan_view, teardown
from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.pools import PoolView, ServiceCount, other_services, pools
from srtr.tui.viewmodel.rows import InstanceRow, instance_row


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
    state: Doc | None = None  # the snapshot this frame shows (a new one: rows may change)

    @property
    def ended(self) -> bool:
        return self.header.phase in JOB_ENDED or self.header.controller_gone

    @property
    def tearing_down(self) -> bool:
        return self.header.phase == JobPhase.TEARING_DOWN


def frame(
    state: Doc, now: float, *, controller_alive: bool = True, previous: Frame | None = None
) -> Frame:
    """Build the frame for `state` at `now`, and its differences from `previous`.

    Rows are built again only for instances whose document changed: a row's AGE is shown
    live from its `started`/`ended`, so time passing changes no row. The same snapshot
    again (ages tick) rebuilds only the header and the teardown panel.
    """
    head = header(state, now, controller_alive=controller_alive)
    tiers = teardown(state, now)
    if previous is not None and previous.state is state:
        return replace(previous, header=head, teardown=tiers, changed=frozenset(), grid_changes=[])
    docs = state.get("instances", [])
    instances = {str(i["name"]): i for i in docs}
    rows, changed = _rows(instances, now, previous)
    grid = _grid(state, instances, changed, previous)
    grid_changes: list[tuple[str, int, GridCell]] | None = None
    if previous is not None:
        old = previous.grid
        if old.columns == grid.columns and old.rows.keys() == grid.rows.keys():
            grid_changes = diff_grid(old.rows, grid.rows)
    return Frame(
        header=head,
        rows=rows,
        pools=pools(state),
        others=other_services(state),
        grid=grid,
        teardown=tiers,
        plan=plan_view(state),
        instances=instances,
        changed=changed,
        grid_changes=grid_changes,
        state=state,
    )


def _grid(
    state: Doc, instances: dict[str, Doc], changed: frozenset[str] | None, previous: Frame | None
) -> NodeGrid:
    """The node grid, built again only for the nodes of changed instances when the nodes
    and where each instance runs are as in `previous`."""
    if previous is None or changed is None:
        return node_grid(state)
    touched: set[str] = set()
    for name in changed:
        node = str(instances[name].get("node", ""))
        if node != str(previous.instances[name].get("node", "")):
            return node_grid(state)
        touched.add(node)
    if [str(n["name"]) for n in state.get("nodes", [])] != list(previous.grid.rows):
        return node_grid(state)
    return node_grid(state, previous.grid, touched)


def _rows(
    instances: dict[str, Doc], now: float, previous: Frame | None
) -> tuple[dict[str, InstanceRow], frozenset[str] | None]:
    """The rows of `instances`, reusing `previous`'s for unchanged documents, and the names
    whose row changed (None when the instance set changed: a table starts over)."""
    if previous is None:
        return {name: instance_row(doc, now) for name, doc in instances.items()}, None
    old_docs, old_rows = previous.instances, previous.rows
    rows: dict[str, InstanceRow] = {}
    changed: set[str] = set()
    for name, doc in instances.items():
        before = old_docs.get(name)
        row = old_rows.get(name)
        if row is None or before != doc:
            row = instance_row(doc, now)
            changed.add(name)
        rows[name] = row
    if list(old_rows) != list(rows):
        return rows, None
    return rows, frozenset(changed)
