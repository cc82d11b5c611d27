"""The pools view: each pool with its nodes and ready count, its riders listed under it."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from srtr.tui.viewmodel import PoolView, ServiceCount


class PoolsPanel(Static):
    """`train 2/2 ready  node[2-3]`, then `└ watcher 2/2 ready` per rider."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[list[PoolView], list[ServiceCount]] | None = None

    def show(self, pools: list[PoolView], others: list[ServiceCount]) -> None:
        if self._shown == (pools, others):
            return  # unchanged: no re-render
        self._shown = (pools, others)
        text = Text(no_wrap=True, overflow="ellipsis")
        for pool in pools:
            text.append(pool.owner.text, style=f"bold {pool.owner.style}")
            text.append(f"  {pool.nodes}\n", style="dim")
            if pool.scale:
                text.append(f"  {pool.scale}\n", style="cyan")
            if pool.pending:
                text.append(f"  Pending: {pool.pending}\n", style="yellow")
            for index, rider in enumerate(pool.riders):
                branch = "└ " if index == len(pool.riders) - 1 else "├ "
                text.append("  " + branch, style="dim")
                text.append(rider.text + "\n", style=rider.style)
        if others:
            text.append("other services\n", style="dim italic")
            for service in others:
                text.append("  " + service.text + "\n", style=service.style)
        if not pools and not others:
            text.append("no pools", style="dim")
        text.rstrip()
        self.update(text)
