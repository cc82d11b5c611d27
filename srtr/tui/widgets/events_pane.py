"""The events pane: events.jsonl newest first, Warning events in yellow, JobFailed red."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from srtr.runtime.progress import REASON_WIDTH
from srtr.tui.viewmodel import EventLine


class EventsPane(VerticalScroll):
    """A scrollable list of recent events; re-rendered only when its lines change."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._body = Static("", id="events-body")
        self._shown: list[EventLine] | None = None

    def compose(self) -> ComposeResult:
        yield self._body

    def show(self, lines: list[EventLine]) -> None:
        if lines == self._shown:
            return
        self._shown = lines
        text = Text(no_wrap=True, overflow="ellipsis")
        for line in lines:
            text.append(f"{line.age:>6} ", style="dim")
            if line.alarm:
                text.append(f"{line.reason:<{REASON_WIDTH}}", style="bold red")
                text.append(f" {line.object}: ", style="bold")
                text.append(line.message, style="red")
            elif line.warning:
                text.append(f"{line.reason:<{REASON_WIDTH}}", style="bold yellow")
                text.append(f" {line.object}: ", style="bold")
                text.append(line.message, style="yellow")
            else:
                text.append(f"{line.reason:<{REASON_WIDTH}}", style="cyan")
                text.append(f" {line.object}: ", style="bold")
                text.append(line.message)
            text.append("\n")
        text.rstrip()
        self._body.update(text if lines else Text("no events yet", style="dim"))
