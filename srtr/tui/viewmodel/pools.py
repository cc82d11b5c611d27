"""The pools panel: `train 2/2 ready` per pool with its riders, and the services outside pools."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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


def _tally(instances: Iterable[Doc], key: Callable[[Doc], Hashable]) -> dict[Any, ServiceCount]:
    """Ready, total and the worst phase per `key` of the instances (None: left out), in one
    pass: a job of 80,000 instances is counted on every snapshot."""
    tally: dict[Any, list[Any]] = {}  # key: [ready, total, worst severity, worst phase]
    for inst in instances:
        group = key(inst)
        if group is None:
            continue
        counts = tally.get(group)
        if counts is None:
            counts = tally[group] = [0, 0, -1, ""]
        phase = str(inst.get("phase", ""))
        counts[1] += 1
        if ready_now(inst):
            counts[0] += 1
        severity = SEVERITY.get(phase, 10)
        if severity > counts[2]:
            counts[2], counts[3] = severity, phase
    return {group: ServiceCount("", c[0], c[1], c[3]) for group, c in tally.items()}


@functools.lru_cache(maxsize=32)
def _hostlist(nodes: tuple[str, ...]) -> str:
    """`node[1-10000]`: a pool's nodes rarely change, and compressing 10,000 names is slow."""
    return str(hostlist.collect_hostlist(list(nodes)))


def _pool_key(inst: Doc) -> tuple[str, str, str] | None:
    if not inst.get("pool"):
        return None
    return (str(inst["pool"]), str(inst.get("kind")), str(inst.get("service")))


def _named(name: str, count: ServiceCount | None) -> ServiceCount:
    if count is None:
        return ServiceCount(name, 0, 0, "")
    return ServiceCount(name, count.ready, count.total, count.worst)


def pools(state: Doc) -> list[PoolView]:
    """`train 2/2 ready` per pool, with its riders listed under it."""
    by_pool = _tally(state.get("instances", []), _pool_key)
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


def other_services(state: Doc) -> list[ServiceCount]:
    """Services outside pools (engine workers, frontend, benchmark, plain services)."""

    def service(inst: Doc) -> str | None:
        return None if inst.get("pool") else str(inst.get("service"))

    counts = _tally(state.get("instances", []), service)
    return [_named(name, count) for name, count in counts.items()]
