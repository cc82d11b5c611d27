"""`?`: every key of the screen it was opened from, read from the live bindings."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from srtr.tui import keys


class HelpScreen(ModalScreen[None]):
    """A table of (key, what it does); any of ?, q, Escape closes it."""

    BINDINGS: ClassVar[list[BindingType]] = keys.HELP_BINDINGS  # listed by `?`

    def __init__(self, keys: list[tuple[str, str]], note: str = "") -> None:
        super().__init__()
        self.keys = keys
        self.note = note

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, description in self.keys:
            table.add_row(key, description)
        with VerticalScroll(id="help-box"):
            yield Static("[b]srtr keys[/b]", id="help-title")
            if self.note:  # first: what quitting does here, whether intents are on
                yield Static(self.note, id="help-note")
            yield Static(table)
