"""summary.json: what `srtr status` prints of a big job without reading its instances.

The state writer (`state_log`) keeps, per instance, the few facts the summary counts (its
service, phase, readiness) and updates them only for the instances a write carries, so the
summary costs O(change) too. The document: the job, its pools (their node lists as a count
and a host list), per service how many instances are in each phase and how many are ready
now, and the first instances that are not as desired (not ready, not done).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from srtr.store.status import Phase

# Instances listed by name among those not as desired (the rest are counted).
LISTED = 20
# Phases an instance may rest in as desired: ready now, or done.
_SETTLED = frozenset({Phase.SUCCEEDED, Phase.STOPPED})

Group = tuple[str, str, str]  # (pool or "", kind, service)
Row = tuple[Group, str, bool]  # (group, phase, ready now)


def _row(inst: Mapping[str, Any]) -> Row:
    group = (str(inst.get("pool") or ""), str(inst.get("kind")), str(inst.get("service")))
    phase = str(inst.get("phase"))
    ready = bool(inst.get("ready")) and phase in (Phase.READY, Phase.RUNNING)
    return group, phase, ready


class Counts:
    """Per service: instances per phase and ready now; and those not as desired, in the
    order they became so."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.phases: dict[Group, Counter[str]] = {}
        self.ready: Counter[Group] = Counter()
        self.unsettled: dict[str, tuple[str, str]] = {}  # name -> (phase, node)

    def rebuild(self, docs: list[Mapping[str, Any]]) -> None:
        self.rows, self.phases, self.ready, self.unsettled = {}, {}, Counter(), {}
        for doc in docs:
            self.update(doc)

    def update(self, inst: Mapping[str, Any]) -> None:
        name = str(inst.get("name"))
        old = self.rows.get(name)
        if old is not None:
            group, phase, ready = old
            self.phases[group][phase] -= 1
            self.ready[group] -= ready
        row = self.rows[name] = _row(inst)
        group, phase, ready = row
        self.phases.setdefault(group, Counter())[phase] += 1
        self.ready[group] += ready
        if ready or phase in _SETTLED:
            self.unsettled.pop(name, None)
        else:  # an instance already listed keeps its place
            self.unsettled[name] = (phase, str(inst.get("node")))

    def services(self) -> list[dict[str, Any]]:
        out = []
        for group, phases in self.phases.items():
            pool, kind, service = group
            counts = {p: n for p, n in phases.items() if n}
            out.append(
                {
                    "pool": pool or None,
                    "kind": kind,
                    "service": service,
                    "total": sum(counts.values()),
                    "ready": self.ready[group],
                    "phases": counts,
                }
            )
        return out

    def not_desired(self) -> list[dict[str, str]]:
        listed = []
        for name, (phase, node) in self.unsettled.items():
            listed.append({"name": name, "phase": phase, "node": node})
            if len(listed) == LISTED:
                break
        return listed


def summary_doc(seq: int, head: Mapping[str, Any], counts: Counts, hosts: dict[str, str]) -> Any:
    """summary.json: the job, its pools (node lists as counts and `hosts`), the counts."""
    pools = []
    for pool in head.get("pools", []):
        brief = {k: v for k, v in pool.items() if k != "nodes"}
        brief["node_count"] = len(pool.get("nodes", []))
        brief["hosts"] = hosts.get(str(pool.get("name")), "")
        pools.append(brief)
    exporters = head.get("exporters") or []
    return {
        "seq": seq,
        "job": head.get("job"),
        "pools": pools,
        "recipe": head.get("recipe"),
        "spare": [n["name"] for n in head.get("nodes", []) if n.get("state") == "spare"],
        "node_count": len(head.get("nodes", [])),
        "instance_count": len(counts.rows),
        "services": counts.services(),
        "not_desired": counts.not_desired(),
        "not_desired_count": len(counts.unsettled),
        "exporters": {
            "total": len(exporters),
            "listed": sum(1 for e in exporters if e.get("listed")),
            "up": sum(1 for e in exporters if e.get("listed") and e.get("up")),
        },
    }
