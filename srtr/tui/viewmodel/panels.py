"""The panels shown above the table while something is under way: the teardown's tiers with
the grace each stopping instance has left, and a live recipe edit (pending or rejected).
"""

from __future__ import annotations

from dataclasses import dataclass

from srtr.store.status import ALIVE, JobPhase, Phase
from srtr.tui.viewmodel.phases import Doc

# -- teardown -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stopping:
    name: str
    phase: str
    remaining: str  # "12s left", "SIGKILL sent", "not signalled yet"


@dataclass(frozen=True, slots=True)
class TierView:
    tier: int
    status: str  # "done" | "stopping" | "waiting"
    total: int
    alive: int
    stopping: list[Stopping]


def teardown(state: Doc, now: float) -> list[TierView] | None:
    """Each tier, which of its instances are still stopping, and their remaining grace.

    None unless the job is tearing down (a finished job shows its tiers as done).
    """
    phase = state.get("job", {}).get("phase")
    if phase != JobPhase.TEARING_DOWN:
        return None
    tiers: dict[int, list[Doc]] = {}
    for inst in state.get("instances", []):
        tiers.setdefault(int(inst.get("shutdown_tier", 0) or 0), []).append(inst)
    views = []
    for tier in sorted(tiers):
        members = tiers[tier]
        alive = [i for i in members if i.get("phase") in ALIVE]
        signalled = [i for i in alive if i.get("phase") == Phase.TERMINATING]
        status = "done" if not alive else ("stopping" if signalled else "waiting")
        stopping = []
        for inst in sorted(
            alive, key=lambda i: (i.get("stop_deadline") is None, i.get("stop_deadline") or 0)
        ):
            deadline = inst.get("stop_deadline")
            if deadline is not None:
                remaining = f"{max(0.0, deadline - now):.0f}s left"
            elif inst.get("phase") == Phase.TERMINATING:
                remaining = "SIGKILL sent"
            else:
                remaining = "not signalled yet"
            stopping.append(Stopping(str(inst["name"]), str(inst.get("phase")), remaining))
        views.append(TierView(tier, status, len(members), len(alive), stopping))
    return views


# -- live recipe edits ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanView:
    """A recipe edit waiting for `a` (apply) / Esc (discard), or one that was rejected."""

    pending: bool
    summary: str
    lines: list[tuple[str, str]]  # (style, text)


_PLAN_KINDS = (
    ("add", "+ add", "green"),
    ("remove", "- remove", "red"),
    ("restart", "↻ restart", "yellow"),
    ("hot", "~ in place", "cyan"),
)


def plan_view(state: Doc) -> PlanView | None:
    recipe = state.get("recipe") or {}
    pending = recipe.get("pending")
    if pending:
        lines = []
        for key, label, style in _PLAN_KINDS:
            for change in pending.get(key) or []:
                detail = f": {change['detail']}" if change.get("detail") else ""
                lines.append(
                    (style, f"{label} {change.get('name')} on {change.get('node')}{detail}")
                )
        lines += [("dim", note) for note in pending.get("notes") or []]
        return PlanView(True, str(pending.get("summary", "")), lines)
    rejected = recipe.get("rejected")
    if rejected:
        return PlanView(
            False,
            "recipe edit rejected: nothing running was touched",
            [("red", str(line)) for line in rejected],
        )
    discarded = recipe.get("discarded")
    if discarded:
        return PlanView(False, f"the recipe file differs from what runs: {discarded}", [])
    return None
