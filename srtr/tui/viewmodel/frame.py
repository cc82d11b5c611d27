"""One frame: everything the main screen shows of one snapshot at one instant, with its
differences from the previous frame, built off the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from srtr.store.status import JOB_ENDED, JobPhase
from srtr.tui.viewmodel.grid import GridCell, NodeGrid, diff_grid, node_grid
from srtr.tui.viewmodel.header import HeaderView, header
from srtr.tui.viewmodel.panels import PlanView, TierView, plan_view, teardown
from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.pools import PoolView, ServiceCount, other_services, pools
from srtr.tui.viewmodel.rows import InstanceRow, instance_rows


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
        return self.header.phase == JobPhase.TEARING_DOWN


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
