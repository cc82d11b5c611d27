"""The pools panel: `train 2/2 ready` per pool with its riders, and the services outside pools."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import hostlist

from srtr.store.rundir import ready_now
from srtr.store.status import Phase
from srtr.tui.viewmodel.phases import PHASE_STYLE, SEVERITY, Doc
from srtr.tui.viewmodel.tally import Tally


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


@functools.lru_cache(maxsize=32)
def _hostlist(nodes: tuple[str, ...]) -> str:
    """`node[1-10000]`: a pool's nodes rarely change, and compressing 10,000 names is slow."""
    return str(hostlist.collect_hostlist(list(nodes)))


def _named(name: str, count: tuple[int, int, str] | None) -> ServiceCount:
    if count is None:
        return ServiceCount(name, 0, 0, "")
    return ServiceCount(name, *count)


def pools(state: Doc, tally: Tally | None = None) -> list[PoolView]:
    """`train 2/2 ready` per pool, with its riders listed under it. `tally`: the state's
    instances counted already (else they are counted here)."""
    by_pool = (tally or Tally.of(state.get("instances", []))).counts()
    views = []
    for pool in state.get("pools", []):
        name = str(pool["name"])
        riders = tuple(_named(r, by_pool.get((name, "rider", r))) for r in pool.get("riders", []))
        nodes = list(pool.get("nodes", []))
        views.append(
            PoolView(
                name=name,
                nodes=_hostlist(tuple(nodes)) if nodes else "",
                node_count=len(nodes),
                owner=_named(name, by_pool.get((name, "owner", name))),
                riders=riders,
                pending=str(pool.get("pending") or ""),
                scale=_scale(pool.get("autoscale")),
            )
        )
    return views


def other_services(state: Doc, tally: Tally | None = None) -> list[ServiceCount]:
    """Services outside pools (engine workers, frontend, benchmark, plain services)."""
    counts = (tally or Tally.of(state.get("instances", []))).counts()
    return [_named(group[2], count) for group, count in counts.items() if not group[0]]
