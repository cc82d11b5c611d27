"""The pools panel's counts (ready, total, the worst phase per service), kept up to date one
changed instance at a time: 80,000 instances are counted once, then each change moves its
instance from one count to another."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from srtr.store.rundir import ready_now
from srtr.tui.viewmodel.phases import SEVERITY, Doc

# A pool's owner or rider (pool, kind, service), or a service outside pools ("", "", service).
Group = tuple[str, str, str]


class Tally:
    """Per group: instances ready, instances in all, and how many are in each phase."""

    def __init__(self, groups: dict[Group, tuple[int, int, dict[str, int]]] | None = None) -> None:
        self._groups = {} if groups is None else groups

    @classmethod
    def of(cls, instances: Iterable[Doc]) -> Tally:
        counts: dict[Group, list[Any]] = {}  # [ready, total, phases]: one pass, no copies
        for inst in instances:
            group = _group(inst)
            entry = counts.get(group)
            if entry is None:
                entry = counts[group] = [0, 0, {}]
            phase = str(inst.get("phase", ""))
            entry[0] += ready_now(inst)
            entry[1] += 1
            entry[2][phase] = entry[2].get(phase, 0) + 1
        return cls({group: (e[0], e[1], e[2]) for group, e in counts.items()})

    def moved(self, before: Iterable[Doc], after: Iterable[Doc]) -> Tally:
        """This tally with the instances `before` replaced by `after` (their new documents)."""
        out = Tally(dict(self._groups))  # the groups it changes are copied as it goes
        touched: set[Group] = set()
        for inst, step in [*((i, -1) for i in before), *((i, 1) for i in after)]:
            group = _group(inst)
            if group not in touched:
                touched.add(group)
                ready, total, phases = out._groups.get(group, (0, 0, {}))
                out._groups[group] = (ready, total, dict(phases))
            out._add(inst, step)
        return out

    def _add(self, inst: Doc, step: int) -> None:
        group = _group(inst)
        ready, total, phases = self._groups.get(group, (0, 0, {}))
        if group not in self._groups:
            self._groups[group] = (ready, total, phases)
        phase = str(inst.get("phase", ""))
        phases[phase] = phases.get(phase, 0) + step
        if not phases[phase]:
            del phases[phase]
        self._groups[group] = (ready + step * ready_now(inst), total + step, phases)

    def counts(self) -> Mapping[Group, tuple[int, int, str]]:
        """(ready, total, worst phase) per group with instances, in the order first seen."""
        out: dict[Group, tuple[int, int, str]] = {}
        for group, (ready, total, phases) in self._groups.items():
            if total:
                worst = max(phases, key=lambda p: SEVERITY.get(p, 10), default="")
                out[group] = (ready, total, worst)
        return out


def _group(inst: Doc) -> Group:
    service = str(inst.get("service"))
    if inst.get("pool"):
        return (str(inst["pool"]), str(inst.get("kind")), service)
    return ("", "", service)
