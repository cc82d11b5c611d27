"""The events pane: events.jsonl newest first, Warning events marked, JobFailed red."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from srtr.store.status import EventType
from srtr.tui.viewmodel.phases import Doc
from srtr.tui.viewmodel.text import age_since


@dataclass(frozen=True, slots=True)
class EventLine:
    age: str
    warning: bool
    reason: str
    object: str
    message: str
    alarm: bool = False  # the job failed: red, not the yellow of any warning


# The events that end a job badly: they must stand out among the warnings.
ALARMS = frozenset({"JobFailed"})


def event_lines(events: Sequence[Doc], now: float, limit: int = 200) -> list[EventLine]:
    """Newest first, at most `limit`."""
    out = []
    for e in reversed(events[-limit:] if limit else events):
        out.append(
            EventLine(
                age=age_since(e.get("ts"), now),
                warning=e.get("type") == EventType.WARNING,
                reason=str(e.get("reason", "")),
                object=str(e.get("object", "")),
                message=str(e.get("message", "")),
                alarm=e.get("reason") in ALARMS,
            )
        )
    return out
