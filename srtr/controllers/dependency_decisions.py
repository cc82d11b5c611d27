"""Pure decisions of `depends_on`: when a dependent's stages begin, what it waits for, when
an init service fails the job, and which dependents restart with their dependency.

The stages of services with `depends_on` leave the phases' chain (`floating`): each begins
once its service's conditions hold, in parallel with the chain and each other. The chain
walks as before (`decisions.next_stage`), except that a stage of a later phase waits for
the dependents of earlier phases (the phases' promise), and the benchmark for all of them.
Values in, a frozen outcome out, as `decisions.py`; tested in
tests/controllers/test_dependency_decisions.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from srtr.controllers.decisions import StageStep, next_stage, owner_text, stage_done
from srtr.resources.expand import PHASE_ORDER
from srtr.resources.objects import DependencySpec, InstanceSpec, Stage
from srtr.store.status import FINISHED, InstanceStatus, Phase

Specs = Mapping[str, InstanceSpec]
Statuses = Mapping[str, InstanceStatus]
Edges = Sequence[DependencySpec]
_RANK = {phase: rank for rank, phase in enumerate(PHASE_ORDER)}


def holds(edge: DependencySpec, statuses: Statuses) -> bool:
    """Whether `edge.condition` holds on every instance of its dependency now: `started`,
    launched and running (or done well); `ready`, that and past its readiness (no probe:
    once launched); `completed`, exited 0 for good."""
    for name in edge.instances:
        status = statuses.get(name)
        if status is None:
            continue  # dropped by a live edit
        done = status.phase is Phase.SUCCEEDED
        if edge.condition == "completed":
            ok = done
        elif edge.condition == "started":
            ok = status.alive or done
        else:
            ok = status.ready and (status.alive or done)
        if not ok:
            return False
    return True


def unmet(service: str, edges: Edges, statuses: Statuses) -> list[DependencySpec]:
    """The edges of `service` whose condition does not hold now."""
    return [e for e in edges if e.service == service and not holds(e, statuses)]


def unmet_all(edges: Edges, statuses: Statuses) -> list[DependencySpec]:
    """Every edge whose condition does not hold now."""
    return [e for e in edges if not holds(e, statuses)]


def waits_text(waiting: Sequence[DependencySpec]) -> str:
    """`scheduler ready, prepare completed`: what a service waits for, as the TUI shows it."""
    return ", ".join(f"{e.on} {e.condition}" for e in waiting)


def floating(stages: Sequence[Stage], specs: Specs, edges: Edges) -> frozenset[str]:
    """The stages of services with depends_on (their setup steps' included)."""
    dependents = {e.service for e in edges}
    return frozenset(
        s.name for s in stages if s.instances and specs[s.instances[0]].service in dependents
    )


@dataclass(frozen=True)
class GraphStep:
    """What the launch stages need now, the chain's and the dependents'.

    `chain`: `next_stage` on the chain, its stage numbers those of the whole launch order.
    `started`/`activate`: dependents' stages that begin now and their members (and members
    a live edit added to dependents' stages that passed). `passed`: dependents' stages up
    now. `fleets`: dependents' stages waiting on their fleet gate. `waiting`: each dependent
    not begun yet and what it waits for. `all_up`: every stage is up.
    """

    chain: StageStep
    started: tuple[tuple[int, Stage], ...] = ()
    activate: tuple[str, ...] = ()
    passed: tuple[tuple[int, str], ...] = ()
    fleets: tuple[Stage, ...] = ()
    waiting: dict[str, str] = field(default_factory=dict)
    all_up: bool = False


def start_step(
    stages: Sequence[Stage],
    edges: Edges,
    specs: Specs,
    statuses: Statuses,
    passed: AbstractSet[str],
    fleets_passed: AbstractSet[str] = frozenset(),
) -> GraphStep:
    """The chain's step and the dependents' (see the module's text)."""
    free = floating(stages, specs, edges)
    number = {s.name: n for n, s in enumerate(stages, 1)}
    walk = _Walk(number, specs, statuses, passed, fleets_passed)
    by_service: dict[str, list[Stage]] = {}
    for stage in stages:
        if stage.name in free:
            by_service.setdefault(specs[stage.instances[0]].service, []).append(stage)
    for service, own in by_service.items():
        walk.service(service, own, unmet(service, edges, statuses))
    up = {*passed, *(name for _, name in walk.up)}  # with the ones up as of this step
    barrier = min(
        (_RANK[s.phase] for s in stages if s.name in free and s.name not in up), default=None
    )
    chain = [s for s in stages if s.name not in free]
    held = [s for s in chain if barrier is not None and _RANK[s.phase] > barrier]
    chain = chain[: len(chain) - len(held)] if held else chain
    step = _renumbered(next_stage(chain, specs, statuses, passed, fleets_passed), number)
    return GraphStep(
        chain=step,
        started=tuple(walk.started),
        activate=tuple(walk.activate),
        passed=tuple(walk.up),
        fleets=tuple(walk.fleets),
        waiting=walk.waiting,
        all_up=step.all_up and not held and barrier is None,
    )


def _renumbered(step: StageStep, number: Mapping[str, int]) -> StageStep:
    """`next_stage`'s step on the chain, numbered as the stages of the whole launch order."""
    started = (number[step.started[1].name], step.started[1]) if step.started else None
    return StageStep(
        activate=step.activate,
        started=started,
        passed=tuple((number[name], name) for _, name in step.passed),
        all_up=step.all_up,
        fleet=step.fleet,
        late=step.late,
        settled=step.settled,
    )


@dataclass
class _Walk:
    """The dependents' stages, one service at a time (`start_step`)."""

    number: Mapping[str, int]
    specs: Specs
    statuses: Statuses
    passed: AbstractSet[str]
    fleets_passed: AbstractSet[str]
    started: list[tuple[int, Stage]] = field(default_factory=list)
    activate: list[str] = field(default_factory=list)
    up: list[tuple[int, str]] = field(default_factory=list)
    fleets: list[Stage] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)

    def service(self, name: str, own: Sequence[Stage], waiting: Sequence[DependencySpec]) -> None:
        """A service's stages in order (setup steps, leader, the rest): the first not up
        begins once its conditions hold, or is waited for."""
        for stage in own:
            pending = [n for n in stage.instances if not self.statuses[n].activated]
            if stage.name in self.passed:
                if not waiting:
                    self.activate += pending  # a live edit grew it: its new members start
                continue
            if pending:
                if waiting:
                    self.waiting[name] = waits_text(waiting)
                else:
                    self.started.append((self.number[stage.name], stage))
                    self.activate += pending
                return
            if not all(stage_done(self.specs[n], self.statuses[n]) for n in stage.instances):
                return
            if stage.fleet is not None and stage.name not in self.fleets_passed:
                self.fleets.append(stage)
                return
            self.up.append((self.number[stage.name], stage.name))


def open_floating(
    stages: Sequence[Stage], free: AbstractSet[str], statuses: Statuses, passed: AbstractSet[str]
) -> list[Stage]:
    """The dependents' stages whose gate is open: begun (every member activated), not up."""
    return [
        s
        for s in stages
        if s.name in free
        and s.name not in passed
        and all(statuses[n].activated for n in s.instances)
    ]


def init_failure(edges: Edges, specs: Specs, statuses: Statuses) -> str | None:
    """Why the job fails because an init service (depended on with `completed`) ended
    for good other than with exit 0, naming its log; None when none did."""
    for edge in edges:
        if edge.condition != "completed":
            continue
        for name in edge.instances:
            status = statuses.get(name)
            if status is None or status.phase is not Phase.FAILED:
                continue
            spec = specs[name]
            how = (
                f"signal {status.exit_signal}"
                if status.exit_signal
                else f"code {'unknown' if status.exit_code is None else status.exit_code}"
            )
            return (
                f"{owner_text(spec)} exited with {how} on {spec.node}; it is an init "
                f"service (services[{edge.service}] waits for it to complete); see {spec.log}"
            )
    return None


def to_restart(edges: Edges, statuses: Statuses) -> list[tuple[str, str]]:
    """(dependent instance, dependency) for each dependent of a `restart: true` edge that
    must start again because its dependency restarted: an instance of the dependency is down
    on its way back (exited, in backoff, held by its pool), or began an attempt after the
    dependent's. Dependents waiting for their launch, or already asked to restart, are not."""
    out: list[tuple[str, str]] = []
    chosen: set[str] = set()
    for edge in edges:
        if not edge.restart:
            continue
        deps = [statuses[n] for n in edge.instances if n in statuses]
        down = any(d.attempt >= 0 and not d.alive and d.phase not in FINISHED for d in deps)
        latest = max((d.started_at for d in deps if d.started_at is not None), default=None)
        for name in edge.dependents:
            status = statuses.get(name)
            if status is None or name in chosen or not _ran(status):
                continue
            began = status.started_at
            if down or (latest is not None and began is not None and latest > began):
                out.append((name, edge.on))
                chosen.add(name)
    return out


def _ran(status: InstanceStatus) -> bool:
    """The dependent ran since its last launch and nobody is stopping it already."""
    if status.user_action is not None or status.attempt < 0 or not status.activated:
        return False
    if status.alive:
        return status.stop_sent_at is None
    return status.exited or status.phase in (Phase.SUCCEEDED, Phase.FAILED)
