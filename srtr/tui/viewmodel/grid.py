"""The node grid: one row per node with its role, its owner instance and one cell per rider."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from srtr.tui.viewmodel.phases import PHASE_GLYPH, PHASE_SHORT, PHASE_STYLE, SEVERITY, Doc
from srtr.tui.viewmodel.text import end_cut


@dataclass(frozen=True, slots=True)
class GridCell:
    text: str
    phase: str
    instance: str | None  # the instance a click on the cell selects

    @property
    def style(self) -> str:
        style = PHASE_STYLE.get(self.phase, "")
        # In a grid of 8 nodes x 5 columns a failure must catch the eye: a filled cell.
        return f"{style} reverse" if self.phase in ALARMING else style


# The phases a grid cell shows filled (reverse video), not just in colour.
ALARMING = frozenset({"Failed", "Lost", "BackOff"})
ROLE_WIDTH = 10  # a pool's name in the ROLE column; longer ones end in `…`
LABEL_WIDTH = 8  # a rider column's heading: the service name, abbreviated


EMPTY_CELL = GridCell("", "", None)


@dataclass(frozen=True, slots=True)
class NodeGrid:
    """One row per node: its role, the owner (or other non-rider instances), one per rider."""

    columns: tuple[str, ...]  # after NODE and ROLE: "owner", then rider service names
    rows: Mapping[str, tuple[GridCell, ...]] = field(default_factory=dict)
    # The instances on each node (names), so that a change redraws only its node's row.
    members: dict[str, list[str]] = field(default_factory=dict)


class GridRows(Mapping[str, tuple[GridCell, ...]]):
    """The grid's rows by node name, each built when first read (the page on screen) and
    kept: 10,000 nodes are not walked for a frame that shows 40 of them."""

    def __init__(
        self,
        nodes: Mapping[str, Doc],
        riders: Sequence[str],
        instances: Mapping[str, Doc],
        members: Mapping[str, list[str]],
        built: dict[str, tuple[GridCell, ...]] | None = None,
    ) -> None:
        self._nodes, self._riders = nodes, riders
        self._instances, self._members = instances, members
        self._built: dict[str, tuple[GridCell, ...]] = {} if built is None else built

    def __getitem__(self, name: str) -> tuple[GridCell, ...]:
        row = self._built.get(name)
        if row is None:
            docs = (self._instances[m] for m in self._members.get(name, []))
            row = self._built[name] = _row(self._nodes[name], self._riders, docs)
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def updated(
        self, nodes: Mapping[str, Doc], instances: Mapping[str, Doc], touched: Iterable[str]
    ) -> GridRows:
        """The rows of the same nodes and placement, with those of `touched` built again."""
        built = dict(self._built)
        for name in touched:
            built.pop(name, None)
        return GridRows(nodes, self._riders, instances, self._members, built)


def _cell(members: Sequence[Doc]) -> GridCell:
    if not members:
        return EMPTY_CELL
    worst = max(members, key=lambda i: SEVERITY.get(str(i.get("phase")), 10))
    phase = str(worst.get("phase", ""))
    text = f"{PHASE_GLYPH.get(phase, ' ')} {PHASE_SHORT.get(phase, phase)}"
    if len(members) > 1:
        text += f" +{len(members) - 1}"
    return GridCell(text, phase, str(worst["name"]))


def _riders(state: Doc) -> tuple[str, ...]:
    riders: list[str] = []
    for pool in state.get("pools", []):
        for rider in pool.get("riders", []):
            if rider not in riders:
                riders.append(rider)
    return tuple(riders)


def _row(node: Doc, riders: Sequence[str], members: Iterable[Doc]) -> tuple[GridCell, ...]:
    owners: list[Doc] = []
    by_rider: dict[str, list[Doc]] = {}
    for inst in members:
        if inst.get("kind") == "rider":
            by_rider.setdefault(str(inst.get("service")), []).append(inst)
        else:
            owners.append(inst)
    role_name = str(node.get("state", "")).removeprefix("pool:")
    role = GridCell(end_cut(role_name, ROLE_WIDTH), "", None)
    return (role, _cell(owners), *(_cell(by_rider.get(r, [])) for r in riders))


def node_grid(
    state: Doc,
    previous: NodeGrid | None = None,
    touched: Iterable[str] | None = None,
    instances: Mapping[str, Doc] | None = None,
) -> NodeGrid:
    """The grid of `state`; with `previous` (of the same nodes, riders and instance
    placement) only the rows of the `touched` nodes are built again. `instances`: the
    state's instances by name, if the caller has them already."""
    riders = _riders(state)
    if instances is None:
        instances = {str(i["name"]): i for i in state.get("instances", [])}
    nodes = {str(n["name"]): n for n in state.get("nodes", [])}
    old = previous.rows if previous is not None else None
    if isinstance(old, GridRows) and touched is not None and previous is not None:
        if previous.columns == ("owner", *riders):
            return NodeGrid(
                previous.columns, old.updated(nodes, instances, touched), previous.members
            )
    members: dict[str, list[str]] = {}
    for name, inst in instances.items():
        members.setdefault(str(inst.get("node", "")), []).append(name)
    return NodeGrid(("owner", *riders), GridRows(nodes, riders, instances, members), members)


def diff_grid(
    old: Mapping[str, tuple[GridCell, ...]],
    new: Mapping[str, tuple[GridCell, ...]],
    nodes: Iterable[str] | None = None,
) -> list[tuple[str, int, GridCell]]:
    """Changed grid cells, for nodes present in both (node sets change only on rebuild);
    among `nodes` only, when the caller knows that no other row changed."""
    out: list[tuple[str, int, GridCell]] = []
    for node in new if nodes is None else nodes:
        cells = new.get(node)
        before = old.get(node)
        if cells is None:
            continue
        if before is None or before == cells:
            continue
        out.extend(
            (node, i, c) for i, (a, c) in enumerate(zip(before, cells, strict=True)) if a != c
        )
    return out


class GridChanges(Sequence[tuple[str, int, GridCell]]):
    """`diff_grid` of two grids, worked out when first read. The grid's widget draws the
    page on screen from the grid itself and reads none of it: a change that touches every
    node (a stage's last write at 10,000 nodes) would otherwise build 10,000 rows of both
    grids, seconds of CPU, for a list nobody reads."""

    def __init__(
        self,
        old: Mapping[str, tuple[GridCell, ...]],
        new: Mapping[str, tuple[GridCell, ...]],
        nodes: Iterable[str] | None = None,
    ) -> None:
        self._args: tuple[Any, ...] | None = (old, new, nodes)
        self._changes: list[tuple[str, int, GridCell]] = []

    def _list(self) -> list[tuple[str, int, GridCell]]:
        if self._args is not None:
            self._changes, self._args = diff_grid(*self._args), None  # the old grid let go
        return self._changes

    @overload
    def __getitem__(self, index: int) -> tuple[str, int, GridCell]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[str, int, GridCell]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self._list()[index]

    def __len__(self) -> int:
        return len(self._list())


def column_label(service: str) -> str:
    """A rider column's heading: the service's name, upper case, abbreviated."""
    return end_cut(service.upper(), LABEL_WIDTH)
