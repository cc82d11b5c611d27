"""The header: job name, backend, SLURM job id, phase, `gen 7/6`, elapsed and time left."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from srtr.tui.viewmodel import HeaderView


class JobHeader(Static):
    """Two lines about the job; the second carries the stage, the reason and a banner."""

    def show(self, view: HeaderView | None, banner: str = "") -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        if view is None:
            text.append("srtr ", style="bold")
            text.append("waiting for state.json …")
        else:
            text.append(f" {view.name} ", style="bold reverse")
            text.append("  backend ", style="dim")
            text.append(view.backend)
            text.append("  slurm job ", style="dim")
            text.append(view.slurm_job_id)
            text.append("  ")
            text.append(f" {view.phase} ", style=f"{view.phase_style} reverse")
            text.append(f"  {view.generation}")
            if view.elapsed:
                text.append("  elapsed ", style="dim")
                text.append(view.elapsed)
            if view.time_left:
                text.append("  left ", style="dim")
                text.append(view.time_left)
            if view.controller_gone:
                text.append("  controller gone", style="bold red")
        second = Text(no_wrap=True, overflow="ellipsis")
        if view is not None and view.stage:
            second.append(view.stage, style="dim")
        if view is not None and view.gate:
            second.append("  " + view.gate, style="bold red")
        if view is not None and view.reason:
            second.append("  " + view.reason, style="italic")
        if banner:
            second.append("  " + banner, style="bold yellow")
        self.update(Text("\n").join([text, second]))
