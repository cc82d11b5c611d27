"""An idle TUI repaints only what time passing changed on screen: the AGE cells whose text
is new, never whole lines or the whole table; the detail pane's and the header's lines that
changed; nothing for a log read that brought nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.geometry import Region
from textual.pilot import Pilot

from srtr.tui import viewmodel as vm
from srtr.tui.app import SrtrApp
from srtr.tui.source import LogChunk
from srtr.tui.widgets import events_pane
from srtr.tui.widgets.detail_pane import DetailPane
from srtr.tui.widgets.events_pane import AGE_WIDTH, EventsPane
from srtr.tui.widgets.instances_table import AGE_COLUMN, InstancesTable
from srtr.tui.widgets.job_header import JobHeader
from srtr.tui.widgets.log_view import LogView
from srtr.tui.widgets.virtual_table import PAD
from tests.tui.test_app import NOW, SIZE, fake_run_dir, loaded


class Painted(list[tuple[Region, ...]]):
    """The regions of each `refresh` of a widget since it was made (and, in `kws`, each
    call's keywords); every call still goes through to the widget."""

    def __init__(self, widget: Any) -> None:
        super().__init__()
        self.kws: list[dict[str, Any]] = []
        self._widget, self._real = widget, widget.refresh

        def spy(*regions: Region, **kw: Any) -> Any:
            self.append(regions)
            self.kws.append(kw)
            return self._real(*regions, **kw)

        widget.refresh = spy

    def clear(self) -> None:
        super().clear()
        self.kws.clear()

    def stop(self) -> None:
        self._widget.refresh = self._real


def on_the_fake_job(
    tmp_path: Path,
    scenario: Callable[[SrtrApp, Pilot[Any]], Awaitable[None]],
    clock: Callable[[], float] = lambda: NOW,
) -> None:
    """Run `scenario` on the TUI of the fake job, once it has loaded and drawn."""
    app = SrtrApp(fake_run_dir(tmp_path), clock=clock, check_controller=False)

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await pilot.pause()
            await scenario(app, pilot)

    asyncio.run(run())


def test_an_ages_tick_repaints_only_the_age_cells_that_changed(tmp_path: Path) -> None:
    now = [NOW]

    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        table = app.query_one(InstancesTable)
        shown = [table._age_at(p) for p in range(table.row_count)]
        assert any(shown), "the fake job's rows have ages"
        painted = Painted(table)
        rows = table._index.rows
        table.apply(rows, frozenset(), now[0])
        assert painted == [], "the same time again: nothing on screen changes"

        now[0] += 7  # every running row's age text changes (`5m` -> `5m7s`)
        table.apply(rows, frozenset(), now[0])
        later = [table._age_at(p) for p in range(table.row_count)]
        changed = sum(a != b for a, b in zip(shown, later, strict=True))
        assert changed > 0
        assert len(painted) == changed
        age = table.columns[AGE_COLUMN]
        left = sum(c.width + 2 * PAD for c in table.columns[:AGE_COLUMN])
        for regions in painted:
            assert len(regions) == 1, "a region, never the whole table"
            (region,) = regions
            assert (region.x, region.width, region.height) == (left, age.width + 2 * PAD, 1)
        await pilot.pause()  # the compositor draws the cells it was told to

        painted.clear()
        table.apply(rows, frozenset(), now[0])
        assert painted == [], "drawn already: a second tick repaints nothing"
        painted.stop()
        assert later[0] in table.render_line(1).text

    on_the_fake_job(tmp_path, scenario, clock=lambda: now[0])


def test_an_ages_tick_repaints_only_the_ages_of_the_events_in_view(tmp_path: Path) -> None:
    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        pane = app.query_one(EventsPane)
        before = pane._shown
        assert before, "the fake job has events"
        painted = Painted(pane)
        later = vm.event_lines(list(app.events), NOW + 7)
        pane.show(later)
        height = pane.scrollable_content_region.height
        changed = sum(a.age != b.age for a, b in zip(before[:height], later, strict=False))
        assert changed > 0
        assert len(painted) == changed
        for regions in painted:
            (region,) = regions
            assert (region.x, region.width, region.height) == (0, AGE_WIDTH + 1, 1)
        assert pane.text.splitlines()[0].strip().startswith(later[0].age)

        painted.clear()
        pane.show(vm.event_lines(list(app.events), NOW + 7))
        assert painted == [], "the same ages again: nothing repainted"
        painted.stop()

    on_the_fake_job(tmp_path, scenario)


def test_a_line_drawn_again_draws_only_its_new_cells(tmp_path: Path) -> None:
    now = [NOW]

    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        table = app.query_one(InstancesTable)
        line = 1 + next(p for p in range(table.row_count) if table._age_at(p))
        drawn: list[str] = []
        real_cell = table._cell

        def spy(cell: Any, width: int, style: Any) -> Any:
            drawn.append(cell.plain)
            return real_cell(cell, width, style)

        table._cell = spy  # type: ignore[method-assign]
        first = table.render_line(line).text
        drawn.clear()
        assert table.render_line(line).text == first
        assert drawn == [], "the same line again: every cell drawn already"
        now[0] += 7
        table.now = now[0]
        second = table.render_line(line).text
        assert drawn == [table._age_at(line - 1)], "only the AGE cell is new"
        assert second != first and len(second) == len(first)

    on_the_fake_job(tmp_path, scenario, clock=lambda: now[0])


def test_an_ages_tick_repaints_only_the_detail_lines_and_header_line_that_changed(
    tmp_path: Path,
) -> None:
    now = [NOW]

    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        assert app.frame is not None
        body = app.query_one(DetailPane)._body
        header = app.query_one(JobHeader)
        lines_before = [body.render_line(y).text for y in range(body.size.height)]
        painted = {"body": Painted(body), "header": Painted(header)}
        app._show_detail()
        header.show(app.frame.header)
        assert painted == {"body": [], "header": []}, "the same time: nothing repainted"

        now[0] += 60  # the selected instance's age and the job's elapsed time tick
        app._show_detail()
        header.show(vm.frame(app.frame.state, now[0]).header)
        for name, widget in (("body", body), ("header", header)):
            assert painted[name], f"the {name} shows an age"
            for regions, kw in zip(painted[name], painted[name].kws, strict=True):
                assert not kw.get("layout"), f"{name}: the same height: no layout"
                (region,) = regions  # a line, never the whole widget
                assert (region.x, region.height, region.width) == (0, 1, widget.size.width)
        lines_after = [body.render_line(y).text for y in range(body.size.height)]
        changed = {
            y for y, (a, b) in enumerate(zip(lines_before, lines_after, strict=True)) if a != b
        }
        assert changed == {regions[0].y for regions in painted["body"]}
        assert len(changed) < len(lines_after), "most lines stay as they were"
        assert [r[0].y for r in painted["header"]] == [0], "the elapsed time's line"

    on_the_fake_job(tmp_path, scenario, clock=lambda: now[0])


def test_a_log_read_that_brings_nothing_repaints_nothing(tmp_path: Path) -> None:
    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        log = app.query_one(LogView)
        assert app.source.want_log is not None
        painted = Painted(log)
        log.apply(LogChunk(app.source.want_log, [], reset=False))
        assert painted == [], "no new line: the pane and its title stay as drawn"
        log.apply(LogChunk(app.source.want_log, ["one more line"], reset=False))
        assert painted, "a new line is drawn"
        assert log.lines[-1] == "one more line"

    on_the_fake_job(tmp_path, scenario)


def test_an_events_tick_draws_the_new_ages_in_front_of_the_rest_drawn_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        pane = app.query_one(EventsPane)
        width = pane.scrollable_content_region.width
        first = pane.render_line(0).text
        assert len(first) == width
        drawn: list[str] = []
        real = events_pane._after_age

        def spy(line: vm.EventLine) -> Any:
            drawn.append(line.reason)
            return real(line)

        monkeypatch.setattr(events_pane, "_after_age", spy)
        later = vm.event_lines(list(app.events), NOW + 7)
        pane.show(later)
        second = pane.render_line(0).text
        assert drawn == [], "the rest of the line is as drawn before"
        whole = events_pane.line_text(later[0])
        whole.truncate(width, overflow="ellipsis", pad=True)
        assert second == whole.plain, "the same line as drawn whole"
        assert second != first and second[AGE_WIDTH:] == first[AGE_WIDTH:]

    on_the_fake_job(tmp_path, scenario)


def test_the_detail_pane_draws_anew_in_another_theme(tmp_path: Path) -> None:
    async def scenario(app: SrtrApp, pilot: Pilot[Any]) -> None:
        body = app.query_one(DetailPane)._body
        dark = body.render_line(0)
        app.theme = "textual-light"
        await pilot.pause()
        light = body.render_line(0)
        assert light.text == dark.text
        assert light != dark, "the lines drawn in the dark theme are not kept"
        assert light == body.render_line(0)

    on_the_fake_job(tmp_path, scenario)
