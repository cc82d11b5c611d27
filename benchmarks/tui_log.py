"""TUI log: what one new line costs the log view with 200,000 lines loaded; what a search costs.

The log view (`srtr.tui.widgets.log_view.LogView`) runs in a headless Textual App (the same
widget as in the TUI, fed the `LogChunk`s the run-dir reader hands it), with a search
active and long lines wrapped: the worst case, since both keep per-line state. Figures:

- apply of one new line: median and p99 of 200, in ms (also with the frame drawn, which
  includes Pilot's wait for the App to be idle);
- one keystroke of a search over 200,000 lines (the model's full pass: a new first letter);
- toggling wrap on 200,000 lines.

Baseline: the same apply with 1,000 lines loaded; the ratio shows whether a line's cost
grows with what is loaded (the target: it does not, ratio ≤ 3).
"""

from __future__ import annotations

import asyncio
import time

from textual.app import App, ComposeResult

from benchmarks.common import Context, Figure, median, percentile
from srtr.tui import viewmodel as vm
from srtr.tui.source import LogChunk
from srtr.tui.widgets.log_view import LogView

KEY = ("service_train_node2", "logs/service_train_node2.out", False)
BIG = 200_000


class _LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LogView(id="log")


def _lines(count: int) -> list[str]:
    return [f"step {i:08d} loss {i % 97 / 10:.2f} " + "x" * (i % 180) for i in range(count)]


async def _appends(loaded: int, samples: int) -> tuple[list[float], list[float]]:
    """(apply, apply + the frame drawn) of each new line, in ms."""
    app = _LogApp()
    async with app.run_test(size=(140, 45)) as pilot:
        log = app.query_one(LogView)
        log.apply(LogChunk(KEY, _lines(loaded), reset=True))
        log.focus()
        await pilot.press("slash", *"loss 1", "enter", "w", "G")
        costs: list[float] = []
        framed: list[float] = []
        for i in range(samples):
            started = time.perf_counter()
            log.apply(LogChunk(KEY, [f"step new {i} loss 1.00"], reset=False))
            costs.append((time.perf_counter() - started) * 1000)
            await pilot.pause()  # the frame drawn (with Pilot's own wait for idle)
            framed.append((time.perf_counter() - started) * 1000)
        assert log.follow and log.lines[-1] == f"step new {samples - 1} loss 1.00"
        return costs, framed


def run(ctx: Context) -> list[Figure]:
    samples = 50 if ctx.quick else 200
    big, big_framed = asyncio.run(_appends(BIG, samples))
    small, small_framed = asyncio.run(_appends(1_000, samples))
    model = vm.LogLines(BIG + 10)
    model.append(_lines(BIG), at=None)
    search: list[float] = []
    wrap: list[float] = []
    for letter in "slx" * (1 if ctx.quick else 3):
        started = time.perf_counter()
        model.set_pattern(vm.search_pattern(letter))
        search.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        model.set_layout(wrap=not model.wrap, width=120)
        wrap.append((time.perf_counter() - started) * 1000)
    ctx.log(
        f"tui_log: one new line with {BIG:,} loaded {median(big):.2f} ms (1,000 loaded: "
        f"{median(small):.2f} ms); search {median(search):.0f} ms; wrap {median(wrap):.0f} ms"
    )
    return [
        Figure(
            "tui_log",
            f"log view: one new line, {BIG:,} lines loaded, search + wrap on (median)",
            median(big),
            "ms",
            baseline=median(small),
            baseline_label="the same with 1,000 lines loaded",
            target=3.0,
            target_on="ratio",
            note=f"median of {samples}; p99 {percentile(big, 99):.2f} ms; with the frame "
            f"drawn {median(big_framed):.0f} ms (1,000 loaded: {median(small_framed):.0f} ms)",
            extra={"big_ms": big, "small_ms": small, "big_framed_ms": big_framed},
        ),
        Figure(
            "tui_log",
            f"log view: one search keystroke over {BIG:,} lines (full pass)",
            median(search),
            "ms",
            target=200.0,
            note=f"median of {len(search)}",
            extra={"search_ms": search},
        ),
        Figure(
            "tui_log",
            f"log view: wrap toggled on {BIG:,} lines",
            median(wrap),
            "ms",
            note=f"median of {len(wrap)}; no target",
            extra={"wrap_ms": wrap},
        ),
    ]
