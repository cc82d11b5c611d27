"""Typed transitions of live recipe edits: the desired state, the pending plan, removals.

`apply_edit` makes a new desired state current (generation+1): added instances get a fresh
status, changed ones a restart request, dropped ones wait in `removing` until their process
is gone and `forget` drops their records. In confirm mode a plan waits in `pending` for the
user's yes (`hold_plan`, `take_pending`, `discard_pending`); `reject_plan` records an edit
that cannot apply. As in `transitions.py`, nothing here enqueues: the edits controller does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from srtr.resources.carving import without
from srtr.resources.diff import Change, Plan
from srtr.resources.objects import DesiredState, InstanceSpec
from srtr.store.status import InstanceStatus, UserAction
from srtr.store.status_parts import RecipeOutcome
from srtr.store.store_base import StoreBase


class EditTransitions(StoreBase):
    """Transitions of the desired state by live edits, mixed into `Store`."""

    def recipe_saved(self, text: str) -> None:
        """The recipe file was saved with `text` (the recipe controller plans it)."""
        self.recipe.saved, self.recipe.unreadable = text, None

    def recipe_unreadable(self, lines: list[str]) -> None:
        """The recipe file was saved but cannot be read (`lines`: why)."""
        self.recipe.unreadable = lines

    def recipe_unchanged(self, text: str) -> None:
        """The recipe's text changed but nothing to roll out (e.g. only comments, or an edit
        that was rejected or discarded saved back to what runs)."""
        recipe = self.recipe
        recipe.text = text
        was = recipe.outcome
        told = (was is RecipeOutcome.REJECTED and recipe.rejected) or (
            was is RecipeOutcome.DISCARDED and recipe.discarded
        )
        self._outcome(RecipeOutcome.IN_SYNC)
        if told:
            # The warning (or the discarded plan) that said the file differs goes away: say
            # why, or the user sees it vanish with nothing in the event log.
            self.record("job", "RecipeInSync", "the recipe file matches what runs again")
        else:
            self.changed()

    def _outcome(self, outcome: RecipeOutcome, plan: Plan | None = None) -> None:
        recipe = self.recipe
        recipe.outcome, recipe.plan = outcome, plan
        recipe.rejected = recipe.discarded = None
        recipe.failed = []

    def hold_plan(self, new: DesiredState, plan: Plan, text: str) -> None:
        """Confirm mode: keep the plan until the user applies or discards it."""
        self.recipe.pending = (new, plan, text)
        self._outcome(RecipeOutcome.PENDING, plan)
        self.record(
            "job", "PlanPending", f"recipe changed: {plan.summary()}; apply with `a` in the TUI"
        )

    def reject_plan(self, lines: list[str], plan: Plan | None = None) -> None:
        """Record a refused edit; nothing running is touched."""
        self._outcome(RecipeOutcome.REJECTED, plan)
        self.recipe.rejected = lines
        self.record("job", "RecipeRejected", "; ".join(lines), warning=True)

    def take_pending(self) -> tuple[DesiredState, Plan, str]:
        """The plan waiting for the user's yes, no longer waiting. Raises LookupError if none."""
        pending = self.recipe.pending
        if pending is None:
            raise LookupError("no recipe change is waiting to be applied")
        self.recipe.pending = None
        return pending

    def discard_pending(self) -> None:
        """The user said no to the waiting plan. Raises LookupError if none waits."""
        if self.recipe.pending is None:
            raise LookupError("no recipe change is waiting")
        _, plan, _ = self.recipe.pending
        self.recipe.pending = None
        # The file still holds the discarded change: state.json says so until it is saved
        # again (`recipe.discarded`, shown by `srtr status` and the TUI's header).
        self._outcome(RecipeOutcome.DISCARDED)
        self.recipe.discarded = f"its change was discarded ({plan.summary()})"
        self.record("job", "PlanDiscarded", "the pending recipe change was discarded")

    def apply_edit(
        self,
        new: DesiredState,
        plan: Plan,
        text: str = "",
        *,
        launching: AbstractSet[str] = frozenset(),
    ) -> None:
        """Make `new` the desired state (generation+1); `plan` must be `diff(current, new)`.

        Added instances get a fresh status; restarted ones a restart request when alive or
        `launching` (their launch is in flight, with the old spec: no event, the edit's
        RecipeApplied says it); hot changes only replace the spec; removed ones wait in
        `removing`. The caller records RecipeApplied once it enqueued them.
        """
        self.job.generation += 1
        self.recipe.text = text or self.recipe.text
        self._outcome(RecipeOutcome.APPLIED, plan)
        after = {s.name: s for s in new.instances}
        for change in plan.add:
            self.specs[change.name] = after[change.name]
            self.status[change.name] = InstanceStatus(added_by_edit=True)
        for change in plan.restart:
            self.specs[change.name] = after[change.name]
            status = self.status[change.name]
            if status.alive or change.name in launching:
                status.user_action = UserAction.RESTART
                status.restart_reason = f"generation {self.job.generation} ({_changed(change)})"
        for change in plan.hot:
            self.specs[change.name] = after[change.name]
        for change in plan.remove:
            self.removing.add(change.name)
        self.desired = new
        self.desired_names = set(after)
        for pool in new.pools:
            self.pool(pool.name)

    def edit_failed(self, names: AbstractSet[str]) -> None:
        """Instances an applied edit added could not start or failed before they were up:
        the edit is marked failed (state.json `recipe.failed`), once per instance."""
        new = sorted(set(names) - set(self.recipe.failed))
        if not new:
            return
        self.recipe.failed += new
        for name in new:
            self.record(
                f"instance/{name}",
                "EditFailed",
                f"{name}, added by a live edit, failed before it was up; the job goes on "
                "without it (fix the recipe and save it again)",
                warning=True,
            )

    def pools_waiting(self, reasons: Mapping[str, str], reason: str, message: str) -> None:
        """Pools now wait for nodes a grow request asked for (`reasons`: pool → why, the
        provider's word; empty: none waits any more); one event on the job says what
        changed, with `reason` (GrowRequested, GrowPending, NodesJoined, GrowCancelled)."""
        for pool in self.pools.values():
            pool.pending = None
        for name, why in reasons.items():
            self.pool(name).pending = why
        self.record("job", reason, message)

    def nodes_released(self, names: Sequence[str], message: str) -> None:
        """Spare nodes went back to their provider: they leave the allocation."""
        self.desired = dataclasses.replace(self.desired, nodes=without(self.desired.nodes, names))
        self.record("job", "NodesReleased", message)

    def forget(self, name: str) -> InstanceSpec:
        """A removed instance's process is gone: drop its records (Stopped); returns its spec."""
        self.touch(name)
        assert name in self.removing and not self.status[name].alive
        spec = self.specs.pop(name)
        self.status.pop(name)
        self.removing.discard(name)
        self.record(
            f"instance/{name}",
            "Stopped",
            f"removed by generation {self.job.generation} (was on {spec.node})",
        )
        return spec


# What the user wrote, for the spec fields a restart names (`argv` is the recipe's command).
_FIELD_WORDS = {"argv": "command"}


def _changed(change: Change) -> str:
    fields = [_FIELD_WORDS.get(f, f) for f in change.detail.split(", ") if f]
    return f"{', '.join(fields)} changed" if fields else "spec changed"
