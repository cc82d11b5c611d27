"""The confirmation asked before every destructive intent (restart, stop, teardown, kill)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from srtr.tui import keys


class ConfirmModal(ModalScreen[bool]):
    """Answers True (y / Enter on Yes) or False (n / Escape).

    `ctrl_c_confirms`: a second Ctrl+C while this is open means yes, as in a headless
    `srtr up` where Ctrl+C tears down at once (the App routes the key here).
    """

    BINDINGS: ClassVar[list[BindingType]] = keys.CONFIRM_BINDINGS  # listed by `?`

    def __init__(self, question: str, detail: str = "", *, ctrl_c_confirms: bool = False) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.ctrl_c_confirms = ctrl_c_confirms

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question")
            if self.detail:
                yield Static(self.detail, id="confirm-detail")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # Enter on a surprise dialog must not destroy

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
