"""Plain progress lines for `srtr up --headless`: one line per event, warnings in colour."""

from __future__ import annotations

import time

from rich.console import Console
from rich.text import Text

from srtr.reconciler.store import Event, EventType

# Per-instance lines that would flood a 4,096-instance job's terminal; they stay in
# events.jsonl and the stage/tier summaries still print.
_QUIET_AT_SCALE = {"Launched", "Ready", "Exited"}


class ProgressPrinter:
    def __init__(self, console: Console, instance_count: int) -> None:
        self.console = console
        self.quiet = instance_count > 64

    def __call__(self, event: Event) -> None:
        if self.quiet and event.reason in _QUIET_AT_SCALE and event.type is EventType.NORMAL:
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
        line = Text(f"{stamp} ")
        style = "yellow" if event.type is EventType.WARNING else "cyan"
        line.append(f"{event.reason:<12}", style=style)
        line.append(f" {event.object}: ", style="bold")
        line.append(event.message)
        self.console.print(line, soft_wrap=True, highlight=False)
