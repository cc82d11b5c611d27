"""A live recipe edit: the plan waiting for `a` (apply) or Esc (discard), or its rejection.

The panel is the preview the user confirms: it lists every instance the edit adds,
removes, restarts or changes in place before anything is touched.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from srtr.tui.viewmodel import PlanView

SHOW_LINES = 8


class PlanPanel(Static):
    """Hidden unless a recipe edit is pending or was rejected."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: PlanView | None = None

    def show(self, view: PlanView | None) -> None:
        self.display = view is not None
        if view is None or view == self._shown:
            self._shown = view
            return
        self._shown = view
        text = Text(no_wrap=True, overflow="ellipsis")
        if view.pending:
            text.append("RECIPE CHANGED ", style="bold yellow")
            text.append(view.summary)
            text.append("   a: apply · Esc: discard\n", style="bold")
        else:
            text.append(view.summary + "\n", style="bold red")
        for style, line in view.lines[:SHOW_LINES]:
            text.append("  " + line + "\n", style=style)
        if len(view.lines) > SHOW_LINES:
            text.append(f"  … {len(view.lines) - SHOW_LINES} more (srtr plan --against)\n", "dim")
        text.rstrip()
        self.update(text)
