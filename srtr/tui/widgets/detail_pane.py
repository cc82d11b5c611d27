"""The detail pane of the selected instance: command, env (masked), probe, restart history."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from srtr.tui.viewmodel import DetailView, phase_style
from srtr.tui.widgets.diffed import DiffedStatic


class DetailPane(VerticalScroll):
    """Renders a `DetailView`; re-renders only when the view changed, and repaints only
    the lines whose text changed when only ages ticked."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._body = DiffedStatic("", id="detail-body")
        self._shown: DetailView | None = None
        self._title: str | None = None  # the border's title, once shown

    def compose(self) -> ComposeResult:
        yield self._body

    def show(self, view: DetailView | None) -> None:
        if view == self._shown and view is not None:
            return
        # Ages tick every second: the body repaints the lines whose text changed, and lays
        # the screen out again only if its height changed.
        self._shown = view
        title = view.title if view else "detail"
        if title != self._title:  # setting it repaints the whole pane, even to the same text
            self._title = self.border_title = title
        body = self._build(view) if view else Text("no instance selected", "dim")
        self._body.update(body)

    @staticmethod
    def _build(view: DetailView) -> RenderableType:
        facts = Table.grid(padding=(0, 1))
        facts.add_column(style="dim", no_wrap=True)
        facts.add_column(overflow="fold")
        for label, value in view.facts:
            style = phase_style(view.phase) if label == "status" else ""
            facts.add_row(label, Text(value, style=style))
        facts.add_row("command", Text(view.command or "—", style="bold"))
        if view.env:
            env = Text()
            for index, (key, value) in enumerate(view.env):
                env.append(("\n" if index else "") + key, style="cyan")
                env.append("=" + value)
            facts.add_row("env", env)
        else:
            facts.add_row("env", Text("—", style="dim"))
        if view.probe:
            state = Text(
                view.probe_state, style="red" if view.probe_state.startswith("fail") else ""
            )
            facts.add_row("probe", Text(view.probe) + Text(" · ") + state)
            if view.last_probe_failure:
                facts.add_row("last failure", Text(view.last_probe_failure, style="red"))
        else:
            facts.add_row("probe", Text("none (ready once launched)", style="dim"))
        parts: list[RenderableType] = [facts]
        if view.history:
            parts.append(Text("\nexits (newest first)", style="bold"))
            parts.extend(Text("  " + line) for line in view.history)
        if view.events:
            parts.append(Text("\nrecent events", style="bold"))
            parts.extend(Text("  " + line) for line in view.events)
        if view.conditions:
            parts.append(Text("\nconditions", style="bold"))
            parts.extend(Text("  " + line, style="dim") for line in view.conditions)
        return Group(*parts)
