"""The header: job name, backend, SLURM job id, phase, `gen 7/6`, elapsed and time left."""

from __future__ import annotations

from rich.text import Text

from srtr.tui.viewmodel import HeaderView
from srtr.tui.widgets.diffed import DiffedStatic


class JobHeader(DiffedStatic):
    """Two lines about the job; the second carries the stage, the reason and a banner."""

    _shown: tuple[HeaderView | None, str] | None = None

    def show(self, view: HeaderView | None, banner: str = "") -> None:
        if self._shown == (view, banner):
            return  # an ages tick whose elapsed time kept its text: no redraw
        self._shown = (view, banner)
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
        # The banner comes first: it says what the App does next (closing in 3s, read-only)
        # and must not be cut off by a long reason, which the events pane shows in full.
        parts = [(banner, "bold yellow")]
        if view is not None:
            parts += [(view.stage, "dim"), (view.gate, "bold red"), (view.reason, "italic")]
        second = Text("  ", no_wrap=True, overflow="ellipsis").join(
            Text(part, style=style) for part, style in parts if part
        )
        # Two lines, always (app.tcss): the elapsed time ticking needs no new layout, and
        # repaints only the line it is on.
        self.update(Text("\n").join([text, second]))
