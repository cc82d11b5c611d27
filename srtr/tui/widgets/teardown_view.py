"""The teardown view: each tier, who is still stopping, and their remaining grace.

It answers process-compose's #354 ("which process keeps it occupied?"): while the job
tears down, every tier shows done / stopping / waiting and names what is still alive.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from srtr.tui.viewmodel import TierView, phase_style

SHOW_PER_TIER = 6


class TeardownView(Static):
    """Hidden unless the job is tearing down."""

    def show(self, tiers: list[TierView] | None) -> None:
        self.display = tiers is not None
        if tiers is None:
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("TEARING DOWN", style="bold magenta")
        text.append("  tier by tier: SIGTERM, then SIGKILL after the grace\n", style="dim")
        for tier in tiers:
            style = {"done": "green", "stopping": "magenta", "waiting": "grey62"}[tier.status]
            text.append(f"tier {tier.tier} ", style="bold")
            text.append(f"{tier.status:<8}", style=style)
            text.append(f" {tier.alive}/{tier.total} alive", style="dim")
            for item in tier.stopping[:SHOW_PER_TIER]:
                text.append("  ")
                text.append(item.name, style=phase_style(item.phase))
                text.append(f" {item.remaining}", style="dim")
            if len(tier.stopping) > SHOW_PER_TIER:
                text.append(f"  +{len(tier.stopping) - SHOW_PER_TIER} more", style="dim")
            text.append("\n")
        text.rstrip()
        self.update(text)
