"""What `srtr status` and the TUI say beyond the table's cells: an instance's countdown
(`next start in 4s`, `SIGKILL in 12s`), the job's spare nodes, and whether the recipe file
differs from what runs (a discarded plan, a rejected edit).

Pure like the rest of the view-model: `now` is passed in.
"""

from __future__ import annotations

from srtr.store.status import Phase
from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.text import fmt_age


def countdown(inst: Doc, now: float) -> str:
    """`next start in 4s` (BackOff), `SIGKILL in 12s` (stopping), or ''."""
    parts = []
    if inst.get("phase") == Phase.BACKOFF and inst.get("next_start_at") is not None:
        parts.append(f"next start in {fmt_age(float(inst['next_start_at']) - now)}")
    if inst.get("stop_deadline") is not None:
        parts.append(f"SIGKILL in {fmt_age(float(inst['stop_deadline']) - now)}")
    return ", ".join(parts)


def spare_nodes(state: Doc) -> list[str]:
    """Nodes of the allocation the recipe does not use (for live growth and lost nodes)."""
    return [str(n.get("name")) for n in state.get("nodes") or [] if n.get("state") == "spare"]


def recipe_drift(state: Doc) -> str:
    """Why the recipe file differs from what runs, or '' when it does not (as far as known).

    A pending plan is not drift (it waits for a yes); a rejected edit and a discarded plan
    are: the file says one thing and the job runs another until the file is saved again.
    """
    recipe = state.get("recipe") or {}
    if recipe.get("rejected"):
        return "the recipe file differs from what runs: its last edit was rejected"
    discarded = recipe.get("discarded")
    if discarded:
        return f"the recipe file differs from what runs: {discarded}"
    return ""
