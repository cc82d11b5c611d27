"""How phases look: colour, glyph and short word of each instance and job phase, and which
phase is the most alarming. The phases themselves are the store's (`srtr.store.status`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from srtr.store.status import JobPhase, Phase

Doc = Mapping[str, Any]  # a part of a state.json snapshot (see `srtr.store.rundir`)

PHASE_STYLE: dict[str, str] = {
    Phase.PENDING: "grey62",
    Phase.STARTING: "yellow",
    Phase.RUNNING: "cyan",
    Phase.READY: "green",
    Phase.BACKOFF: "dark_orange",
    Phase.TERMINATING: "magenta",
    Phase.SUCCEEDED: "blue",
    Phase.FAILED: "bold red",
    Phase.STOPPED: "grey50",
    Phase.LOST: "bold red",
}
PHASE_GLYPH: dict[str, str] = {
    Phase.PENDING: "○",
    Phase.STARTING: "◔",
    Phase.RUNNING: "◑",
    Phase.READY: "●",
    Phase.BACKOFF: "↻",
    Phase.TERMINATING: "◌",
    Phase.SUCCEEDED: "✓",
    Phase.FAILED: "✗",
    Phase.STOPPED: "■",
    Phase.LOST: "?",
}
# The node grid is narrow: one short word per cell.
PHASE_SHORT: dict[str, str] = {
    Phase.PENDING: "Pend",
    Phase.STARTING: "Start",
    Phase.RUNNING: "Run",
    Phase.READY: "Ready",
    Phase.BACKOFF: "BackOff",
    Phase.TERMINATING: "Term",
    Phase.SUCCEEDED: "Done",
    Phase.FAILED: "Failed",
    Phase.STOPPED: "Stop",
    Phase.LOST: "Lost",
}
JOB_PHASE_STYLE: dict[str, str] = {
    JobPhase.PENDING: "grey62",
    JobPhase.LAUNCHING: "yellow",
    JobPhase.RUNNING: "green",
    JobPhase.TEARING_DOWN: "magenta",
    JobPhase.SUCCEEDED: "blue",
    JobPhase.FAILED: "bold red",
}
# A cell that holds several instances shows the most alarming one: that is what a user
# scanning 1,024 rows must not miss.
SEVERITY: dict[str, int] = {
    Phase.FAILED: 9,
    Phase.LOST: 8,
    Phase.BACKOFF: 7,
    Phase.TERMINATING: 6,
    Phase.STARTING: 5,
    Phase.PENDING: 4,
    Phase.RUNNING: 3,
    Phase.READY: 2,
    Phase.STOPPED: 1,
    Phase.SUCCEEDED: 0,
}


def phase_style(phase: str) -> str:
    return PHASE_STYLE.get(phase, "")
