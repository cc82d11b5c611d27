"""diff(current desired, new desired) → Plan: what a live edit would change, and what it can't.

Pure. The recipe watcher and `srtr plan --against` print the plan; applying it is the
controllers' business. An instance is restarted only when its config hash (rendered argv,
env, preamble, container, node, probe target) changed; other differences are "hot" and
apply without touching the process. A per-node `setup` that changed is never run again
on a node where it ran: the new text is for nodes the service gains later.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from srtr.resources.node_setup import per_node, setup_refusals
from srtr.resources.objects import DesiredState, InstanceSpec
from srtr.resources.setup_steps import live_edit_refusals

# Fields that may change under a running process.


@dataclass(frozen=True)
class Change:
    name: str
    service: str
    node: str
    detail: str = ""


@dataclass(frozen=True)
class Plan:
    add: tuple[Change, ...] = ()
    remove: tuple[Change, ...] = ()
    restart: tuple[Change, ...] = ()
    hot: tuple[Change, ...] = ()
    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not (self.add or self.remove or self.restart or self.hot or self.refused)

    @property
    def applicable(self) -> bool:
        return not self.refused and not self.empty

    def summary(self) -> str:
        if self.refused:
            return f"refused: {'; '.join(self.refused)}"
        parts = [
            f"{len(getattr(self, k))} {k}"
            for k in ("add", "remove", "restart", "hot")
            if getattr(self, k)
        ]
        return ", ".join(parts) if parts else "no changes"

    def to_json(self) -> dict[str, Any]:
        def rows(changes: tuple[Change, ...]) -> list[dict[str, str]]:
            return [
                {"name": c.name, "service": c.service, "node": c.node, "detail": c.detail}
                for c in changes
            ]

        return {
            "add": rows(self.add),
            "remove": rows(self.remove),
            "restart": rows(self.restart),
            "hot": rows(self.hot),
            "refused": list(self.refused),
            "notes": list(self.notes),
            "summary": self.summary(),
        }


def _what_changed(old: InstanceSpec, new: InstanceSpec, names: tuple[str, ...]) -> str:
    changed = [n for n in names if getattr(old, n) != getattr(new, n)]
    return ", ".join(changed)


_RESTART_FIELDS = (
    "argv",
    "env",
    "preamble",
    "shell",
    "container",
    "node",
    "probe",
    "cpus_per_task",
    "cpu_bind",
    "srun_options",
    "export_env",
    "memory_limit",
)


def diff(old: DesiredState, new: DesiredState, *, launched: frozenset[str] = frozenset()) -> Plan:
    """What turning `old` into `new` would do. `launched` names instances that have started.

    Refused (each with its reason): engine role, dedicated node or terminal-flag changes, and
    changes to a benchmark step that already started. Carve problems (a pool growing past the
    allocation, a move) surface earlier, as expand errors.
    """
    refused: list[str] = []
    before = {s.name: s for s in old.instances}
    after = {s.name: s for s in new.instances}
    if old.nodes.role_nodes != new.nodes.role_nodes:
        refused.append("engine roles cannot change size or nodes while the job runs")
    if old.frontend_type != new.frontend_type:
        refused.append("frontend.type cannot change while the job runs")
    old_terminal, new_terminal = set(old.terminal_services), set(new.terminal_services)
    if old_terminal != new_terminal:
        flipped = ", ".join(sorted(old_terminal ^ new_terminal))
        refused.append(f"terminal flag of {flipped} cannot flip while the job runs")
    bench_old, bench_new = before.get("benchmark"), after.get("benchmark")
    if "benchmark" in launched and (
        bench_old is None or bench_new is None or bench_old.config_hash() != bench_new.config_hash()
    ):
        refused.append("the benchmark step already started; change it in a new run")
    refused += live_edit_refusals(old, new) + setup_refusals(old, new)
    add, remove, restart, hot = [], [], [], []
    for name, spec in after.items():
        if name not in before:
            add.append(Change(name, spec.service, spec.node))
    for name, spec in before.items():
        if name not in after:
            remove.append(Change(name, spec.service, spec.node))
    for name in before.keys() & after.keys():
        a, b = before[name], after[name]
        # A per-node setup ran on its node already: a new text is for the nodes to come.
        if a.config_hash() != b.config_hash() and not per_node(b):
            restart.append(Change(name, b.service, b.node, _what_changed(a, b, _RESTART_FIELDS)))
        elif a != b:
            hot.append(Change(name, b.service, b.node, _what_changed(a, b, _ALL_FIELDS)))
    key = _order(new)
    return Plan(
        add=tuple(sorted(add, key=key)),
        remove=tuple(sorted(remove, key=_order(old))),
        restart=tuple(sorted(restart, key=key)),
        hot=tuple(sorted(hot, key=key)),
        refused=tuple(refused),
    )


_ALL_FIELDS = tuple(f.name for f in fields(InstanceSpec))


def _order(state: DesiredState) -> Any:
    position = {s.name: i for i, s in enumerate(state.instances)}
    return lambda c: position.get(c.name, len(position))


def render(plan: Plan) -> str:
    """A Nomad-style diff: `+` add, `-` remove, `~` restart, `*` hot, `!` refused."""
    if plan.empty:
        return "No changes.\n"
    lines = []
    for reason in plan.refused:
        lines.append(f"! {reason}")
    for c in plan.add:
        lines.append(f"+ {c.name}  ({c.service} on {c.node})")
    for c in plan.remove:
        lines.append(f"- {c.name}  ({c.service} on {c.node})")
    for c in plan.restart:
        lines.append(f"~ {c.name}  restart: {c.detail} changed")
    for c in plan.hot:
        lines.append(f"* {c.name}  live: {c.detail}")
    lines.append(f"Plan: {plan.summary()}")
    return "\n".join(lines) + "\n"
