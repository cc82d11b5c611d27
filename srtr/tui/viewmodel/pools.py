"""The pools panel: `train 2/2 ready` per pool with its riders, and the services outside pools."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import hostlist

from srtr.store.rundir import ready_now
from srtr.store.status import Phase
from srtr.tui.viewmodel.phases import PHASE_STYLE, SEVERITY, Doc


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
            return PHASE_STYLE[Phase.READY]
        return PHASE_STYLE.get(self.worst, "")


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    nodes: str  # compressed host list: node[2-1025]
    node_count: int
    owner: ServiceCount
    riders: tuple[ServiceCount, ...]
    # Waiting for nodes a grow request asked for: `waiting for 2 node(s) from SLURM (...)`.
    pending: str = ""
    # An autoscaled pool: `autoscaled 2..32: desired 8, size 4` (and why it cannot read).
    scale: str = ""


def _count(name: str, members: Sequence[Doc]) -> ServiceCount:
    worst = max(
        (str(i.get("phase", "")) for i in members), key=lambda p: SEVERITY.get(p, 10), default=""
    )
    return ServiceCount(name, sum(1 for i in members if ready_now(i)), len(members), worst)


def _scale(view: object) -> str:
    if not isinstance(view, dict):
        return ""
    text = f"autoscaled {view.get('min')}..{view.get('max')}: "
    desired = view.get("desired")
    text += (
        f"desired {desired}, size {view.get('size')}"
        if desired is not None
        else (f"size {view.get('size')}, nothing published yet")
    )
    if view.get("error"):
        text += f" (last read: {view['error']})"
    return text


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
                pending=str(pool.get("pending") or ""),
                scale=_scale(pool.get("autoscale")),
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
