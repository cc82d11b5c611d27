"""Pure decisions of stopping: teardown tiers, and one instance's SIGTERM then SIGKILL.

As `decisions`: values in, a frozen outcome out (tests/controllers/test_decisions.py);
`teardown.py` sends the signals and applies the outcome through the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from srtr.controllers.decisions import Specs, Statuses
from srtr.resources.objects import InstanceSpec
from srtr.store.status import InstanceStatus


def lowest_tier(specs: Specs, names: Iterable[str]) -> tuple[int, list[str]]:
    """The lowest shutdown tier among `names`, and its members: the ones to stop first."""
    names = list(names)
    tier = min(specs[n].shutdown_tier for n in names)
    return tier, [n for n in names if specs[n].shutdown_tier == tier]


@dataclass(frozen=True)
class TeardownStep:
    """One step of a teardown.

    `kill`: instances to SIGKILL at once (kill now). `finish`: nothing is alive, the job is
    over. Otherwise `members` of the lowest `tier` still alive get one stop step each, and
    `fresh` are those of them not yet sent SIGTERM.
    """

    kill: tuple[str, ...] = ()
    finish: bool = False
    tier: int | None = None
    members: tuple[str, ...] = ()
    fresh: tuple[str, ...] = ()


def teardown_step(specs: Specs, statuses: Statuses, *, kill_now: bool) -> TeardownStep:
    """Tier by tier, lowest `shutdown_tier` first; a tier is drained before the next."""
    alive = [n for n, st in statuses.items() if st.alive]
    kill = tuple(n for n in alive if not statuses[n].kill_sent) if kill_now else ()
    if not alive:
        return TeardownStep(kill=kill, finish=True)
    tier, members = lowest_tier(specs, alive)
    fresh = tuple(n for n in members if statuses[n].stop_sent_at is None)
    return TeardownStep(kill=kill, tier=tier, members=tuple(members), fresh=fresh)


@dataclass
class TierMemo:
    """The last full `teardown_step`'s tier and members, and the store's `came_alive` then."""

    came_alive: int
    generation: int
    tier: int
    members: list[str]


def tier_step(statuses: Statuses, memo: TierMemo) -> TeardownStep | None:
    """`teardown_step` (without kill now) from `memo` alone, while no instance came alive
    since it was taken: those alive now are among its members, and no lower tier has any.
    None once its tier is drained: the next tier, or the end, needs the full pass."""
    alive = [n for n in memo.members if (st := statuses.get(n)) is not None and st.alive]
    if not alive:
        return None
    fresh = tuple(n for n in alive if statuses[n].stop_sent_at is None)
    return TeardownStep(tier=memo.tier, members=tuple(alive), fresh=fresh)


@dataclass(frozen=True)
class StopStep:
    """Stopping one instance: send SIGTERM (`term`), SIGKILL (`kill`), then wait `wait`
    seconds for the grace deadline (None: nothing left to wait for)."""

    term: bool = False
    kill: bool = False
    wait: float | None = None


def stops_due(
    specs: Specs, statuses: Statuses, names: Iterable[str], now: float
) -> tuple[list[str], float | None]:
    """Which of `names` `stop_step` would signal now (no SIGTERM yet, or past their grace
    and not killed), and the earliest grace deadline of the others still waiting (None:
    none). The same verdicts as `stop_step`'s, without a step made for each member."""
    due: list[str] = []
    earliest: float | None = None
    for name in names:
        status = statuses[name]
        sent = status.stop_sent_at
        if sent is None:
            due.append(name)
            continue
        if status.kill_sent:
            continue
        deadline = sent + specs[name].stop_grace_seconds
        if now >= deadline:
            due.append(name)
        elif earliest is None or deadline < earliest:
            earliest = deadline
    return due, earliest


def stop_step(spec: InstanceSpec, status: InstanceStatus, now: float) -> StopStep:
    """SIGTERM once; SIGKILL once `stop_grace_seconds` passed since the SIGTERM."""
    term = status.stop_sent_at is None
    if status.kill_sent:
        return StopStep(term=term)
    sent = now if status.stop_sent_at is None else status.stop_sent_at
    deadline = sent + spec.stop_grace_seconds
    if now < deadline:
        return StopStep(term=term, wait=deadline - now)
    return StopStep(term=term, kill=True)
