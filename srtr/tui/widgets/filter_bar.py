"""The `/` filter input: typing narrows the instances table, Enter returns to it."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import BindingType
from textual.message import Message
from textual.widgets import Input

from srtr.tui import keys

PLACEHOLDER = "filter: words match any column · column=text (phase=fail) · !word excludes"


class FilterBar(Input):
    """Hidden until `/`; Escape clears the filter and hides it again."""

    class Closed(Message):
        """The user left the filter (Enter keeps it, Escape clears it)."""

    BINDINGS: ClassVar[list[BindingType]] = keys.FILTER_BINDINGS  # listed by `?`

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder=PLACEHOLDER, id=id)

    def open(self) -> None:
        self.display = True
        self.focus()

    def action_close(self, clear: bool = False) -> None:
        if clear:
            self.value = ""
        if not self.value:
            self.display = False
        self.post_message(self.Closed())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_close(False)
