"""The srtr TUI's App: watch and drive one run dir. `launch.py` starts it.

The App reads snapshots and sends intents, nothing else, so that a viewer can never change
the job but through the intents the job itself checks:
- a worker looks at the run dir every 0.25 s (a few stats); when a file changed, or once a
  second (ages tick), a thread reads it (`source.RunSource`) and turns what changed into a
  `viewmodel.Frame` (`frames.FrameReader`); the App only hands the frame to its widgets,
  which write changed cells only;
- keys become intents (`srtr.runtime.control.send`, over the job's control channel: TLS
  from any host, the 0600 socket on the controller's own, also for the TUI of `srtr up`),
  the destructive ones after a confirmation.

The keys are in `keys.py`, the intent keys' actions in `app_intents.py` (this App's base),
what they ask before they send, in `intents.py`; what happens when the job of `srtr up`
ends, in `job_end.py`. Under `srtr up` the first frame may be the job's plan (`planned.py`),
until state.json exists.

Decisions:
- In `srtr up` the job runs in the parent process (`up_process.py`); `job` resolves with
  its code when it ends. The final state then stays on screen for EXIT_AFTER seconds and
  the App exits with the job's code, unless the user is reading (`job_end.py`). If the
  terminal is lost, `srtr up` behaves as on SIGHUP.
- Ctrl+C opens the teardown confirmation; a second Ctrl+C confirms it (headless Ctrl+C
  tears down at once). While tearing down, Ctrl+C asks to kill, and again confirms.
  Restart, stop, teardown and kill always ask; a pending recipe edit is applied with `a`
  without a dialog, because its plan panel on screen is the preview being confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.events import Key, Resize
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from srtr.store.rundir import EventDoc, RunState
from srtr.tui import intents, job_end, keys, themes
from srtr.tui import viewmodel as vm
from srtr.tui.app_intents import IntentApp
from srtr.tui.frames import FrameReader
from srtr.tui.source import Poll, RunSource
from srtr.tui.terminal import HangupSafeDriver, detach_terminal
from srtr.tui.widgets.detail_pane import DetailPane
from srtr.tui.widgets.events_pane import EventsPane
from srtr.tui.widgets.filter_bar import FilterBar
from srtr.tui.widgets.help_screen import HelpScreen
from srtr.tui.widgets.instances_table import InstancesTable
from srtr.tui.widgets.job_header import JobHeader
from srtr.tui.widgets.log_view import LogView
from srtr.tui.widgets.node_grid import NodeGridTable
from srtr.tui.widgets.plan_panel import PlanPanel
from srtr.tui.widgets.pools_panel import PoolsPanel
from srtr.tui.widgets.teardown_view import TeardownView

POLL_INTERVAL = 0.25
FIRST_LOOKS = 0.05  # s between looks for the first state.json
EXIT_AFTER = 3.0  # seconds the final state of a finished `srtr up` job stays on screen
NARROW_BELOW = 110  # columns: below, the pools and the node grid fold away
SHORT_BELOW = 30  # lines: below, the detail, log and events panes get less room
WIDE_FROM = 170  # columns: from here, the node grid gets room for 4 riders side by side
CLOSE_TICK = 0.2  # how often the closing countdown is looked at (it shows whole seconds)
EVENTS_KEPT = 2000
FILTER_DELAY = 0.03  # a pasted or fast-typed filter applies once
RESTART_READER_AFTER = 2.0

Clock = Callable[[], float]


class SrtrApp(IntentApp):
    """Watch and drive one run dir. `job` is the running job's outcome in `srtr up` mode."""

    CSS_PATH = "app.tcss"
    TITLE = "srtr"
    BINDINGS: ClassVar[list[BindingType]] = keys.BINDINGS
    OTHER_KEYS: ClassVar[list[tuple[str, str]]] = keys.OTHER_KEYS
    # Esc is `action_escape`, after the focused widget's own Esc (the log's search).
    ESCAPE_TO_MINIMIZE = False

    def __init__(
        self,
        run_dir: Path,
        *,
        job: asyncio.Future[int] | None = None,
        plan: asyncio.Future[int] | None = None,
        clock: Clock = time.time,
        poll_interval: float = POLL_INTERVAL,
        exit_after: float = EXIT_AFTER,
        check_controller: bool = True,
        theme_name: str | None = None,
        source: RunSource | None = None,
        state: RunState | None = None,
        nice: int = 0,
    ) -> None:
        """`source` and `state`: a reader of `run_dir` that read its state.json already,
        and what it read (`srtr tui` checks the run dir so: a large one is parsed once).
        `plan`: under `srtr up`, the descriptor of the job's plan once the controller has
        made it (`planned.py`): the first frame until state.json exists.
        `nice`: added to the niceness of the App's thread and of its reading threads once
        the first frame is on screen (Linux nices one thread at a time)."""
        super().__init__()
        # `--theme`, else SRTR_THEME, else dark (the CLI has checked the name already).
        self.theme = themes.resolve(theme_name, self.available_themes)
        self.run_dir = run_dir
        self.job = job
        self._plan = plan
        self.clock = clock
        self.poll_interval = poll_interval
        self.exit_after = exit_after
        self.check_controller = check_controller
        self.source = source or RunSource(run_dir)
        self.source.events_kept = EVENTS_KEPT
        # Under `srtr up` (a job task) the controller is this very process: it runs.
        watched = check_controller and job is None
        self._reader = FrameReader(self.source, run_dir, watch_controller=watched, state=state)
        self.frame: vm.Frame | None = None
        self.events: deque[EventDoc] = deque(maxlen=EVENTS_KEPT)
        self.frames = 0  # frames applied: tests wait on it instead of sleeping
        self._nice = nice
        self.last_apply_seconds = 0.0
        self._wake = asyncio.Event()
        self._banner = ""
        self._teardown_sent = False
        self._quit_when_done = False
        self._exit_timer: Timer | None = None
        self._close_at = 0.0
        self._filter_timer: Timer | None = None
        self._last_key_at = float("-inf")
        self._job_code: int | None = None
        self._last_error = ""
        self._terminal_gone = False
        self._detached = False
        self._focus_before_log: Widget | None = None  # focused before the full-screen log

    def get_driver_class(self) -> type[Driver]:
        if sys.platform.startswith("win"):
            return super().get_driver_class()
        return HangupSafeDriver

    @property
    def terminal_gone(self) -> bool:
        """The terminal hung up or stopped taking output (nothing more to print on it)."""
        return self._terminal_gone

    def terminal_lost(self) -> None:
        """The terminal hung up or stopped taking output: nobody can see or drive this App.

        It leaves at once. Under `srtr up` its exit status says so (`up_process.GONE`),
        and `srtr up` then behaves as on SIGHUP, whatever told us first: the job tears
        down as a headless one does on a hang-up and `srtr up` exits 129. A viewer
        (`srtr tui`) just leaves.
        """
        if self._terminal_gone:
            return
        self._terminal_gone = True
        detach_terminal()
        self.exit(self._exit_code())

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield JobHeader(id="header")
        yield TeardownView(id="teardown")
        yield PlanPanel(id="plan")
        with Horizontal(id="body"):
            with Vertical(id="sidebar"):
                yield PoolsPanel(id="pools")
                yield NodeGridTable(id="grid")
            with Vertical(id="main"):
                yield FilterBar(id="filter")
                yield InstancesTable(id="instances")
                with Horizontal(id="lower"):
                    yield DetailPane(id="detail")
                    yield LogView(id="log")
        yield EventsPane(id="events")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(FilterBar).display = False
        self.query_one(TeardownView).display = False
        self.query_one(PlanPanel).display = False
        self.query_one(JobHeader).show(None)
        self.query_one("#pools").border_title = "pools"
        self.query_one("#grid").border_title = "nodes"
        self.query_one("#instances").border_title = "instances"
        self.query_one("#events").border_title = "events (newest first)"
        self.query_one(InstancesTable).focus()
        self._fit(self.size.width, self.size.height)
        if self.job is not None:
            self.job.add_done_callback(lambda _task: self.call_later(self._job_finished))
        if self._plan is not None:
            self._plan.add_done_callback(self._planned)
        self._follow()

    def _planned(self, plan: asyncio.Future[int]) -> None:
        if not plan.cancelled() and plan.exception() is None:
            self._reader.plan_fd = plan.result()
            self._wake.set()

    # -- fitting the terminal ---------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        """Fold the side panes on a narrow terminal and shrink the lower ones on a short
        one (app.tcss `.narrow`, `.short`): the instances table keeps NAME, PHASE, READY."""
        self.set_class(width < NARROW_BELOW, "narrow")
        self.set_class(width >= WIDE_FROM, "wide")
        self.set_class(height < SHORT_BELOW, "short")

    # -- reading ------------------------------------------------------------------------

    @work(exclusive=True, group="source", exit_on_error=False)
    async def _follow(self) -> None:
        """Poll the run dir forever; a thread reads and builds, the loop applies."""
        last_frame_at = float("-inf")
        while True:
            # Cleared before reading, so a wake-up that arrives during the read (a new
            # selection) is not lost: the wait below then returns at once.
            self._wake.clear()
            now = self.clock()
            # Ages tick even when nothing changed: rebuild the frame once a second.
            rebuild_anyway = time.monotonic() - last_frame_at >= 1.0
            quiet = self._reader.quiet()
            if rebuild_anyway or not quiet:
                poll, frame = await self._reader.read_soon(now, rebuild_anyway, quiet)
                if frame is not None:
                    last_frame_at = time.monotonic()
                self._apply(poll, frame, now)
                if self.source.behind:
                    continue  # a fast writer: keep reading, the view lags but drops nothing
            with contextlib.suppress(TimeoutError):
                # Until the first frame (the job's first state.json) a look is all a poll
                # is: look often, and show the job as soon as it is written.
                wait = self.poll_interval if self.frames else min(self.poll_interval, FIRST_LOOKS)
                await asyncio.wait_for(self._wake.wait(), wait)

    @on(Worker.StateChanged)
    def _on_worker_state(self, event: Worker.StateChanged) -> None:
        """The one place worker failures land: say so, and keep the view alive."""
        if event.state is not WorkerState.ERROR:
            return
        worker = event.worker
        self.notify(f"{worker.name}: {worker.error}", title="TUI error", severity="error")
        if worker.group == "source":
            # Reading must go on, but not in a tight loop if the failure repeats.
            self.set_timer(RESTART_READER_AFTER, self._follow)

    def _apply(self, poll: Poll, frame: vm.Frame | None, now: float) -> None:
        started = time.perf_counter()
        if poll.error and poll.error != self._last_error:
            self.notify(poll.error, severity="warning", timeout=5)
        self._last_error = poll.error
        if poll.events:
            self.events.extend(poll.events)
        if frame is not None:
            self._show_frame(frame)
        if poll.events or frame is not None:
            self.query_one(EventsPane).show(vm.event_lines(list(self.events), now))
        if poll.log is not None and poll.log.key == self.source.want_log:
            self.query_one(LogView).apply(poll.log)
        self.last_apply_seconds = time.perf_counter() - started

    def _show_frame(self, frame: vm.Frame) -> None:
        was_ended = self.frame is not None and self.frame.ended
        was_pending = self._plan_pending
        self.frame = frame
        if self._plan_pending != was_pending:
            self.refresh_bindings()
        if frame.ended and not was_ended:
            if self.job is None:
                self._banner = intents.read_only_banner(frame.header)
            self.refresh_bindings()
        self.query_one(JobHeader).show(frame.header, self._banner)
        self.query_one(TeardownView).show(frame.teardown)
        self.query_one(PlanPanel).show(frame.plan)
        self.query_one(PoolsPanel).show(frame.pools, frame.others)
        self.query_one(NodeGridTable).show(frame.grid, frame.grid_changes)
        table = self.query_one(InstancesTable)
        table.apply(frame.rows, frame.changed, self.clock(), frame.widths)
        if frame.ended and not was_ended:
            self._select_worst(frame)
        if table.row_count == 0:
            self._select(None)
        elif self.source.want_log is None:
            self._select(table.selected)
        self._show_detail()
        self.frames += 1
        if self.frames == 1 and self._nice:
            self._reader.nice = self._nice
            os.nice(self._nice)  # raising one's niceness needs no privilege

    def _show_detail(self) -> None:
        want = self.source.want_log
        inst = self.frame.instances.get(want[0]) if (self.frame and want) else None
        view = None
        if inst is not None:
            view = vm.detail(
                inst,
                self.clock(),
                events=list(self.events)[-500:],
                last_probe_failure=self._reader.probe_failures.get(str(inst["name"]), ""),
            )
        self.query_one(DetailPane).show(view)

    def _select(self, name: str | None, previous: bool | None = None) -> None:
        """Follow `name`'s log (and show its details) from the next poll on."""
        inst = self.frame.instances.get(name) if (self.frame and name) else None
        if inst is None:
            self.source.want_log = None
        else:
            keep = self.source.want_log[2] if self.source.want_log else False
            prev = keep if previous is None else previous
            want = (str(inst["name"]), str(inst.get("log", "")), prev)
            if want != self.source.want_log:
                self.source.want_log = want
                self._wake.set()
        self._show_detail()

    def _select_worst(self, frame: vm.Frame) -> None:
        """The job ended: put the cursor on the instance that failed it, if one did."""
        name = frame.header.cause_instance or vm.worst_doc(frame.instances.values())
        if name is not None:
            self._choose(name)

    def _choose(self, name: str) -> None:
        """Select `name` in the instances table, clearing a filter that hides it."""
        table = self.query_one(InstancesTable)
        if not table.select(name):
            self.query_one(FilterBar).value = ""
            table.set_filter("")
            table.select(name)

    @on(InstancesTable.SelectionChanged)
    def _on_selection(self, message: InstancesTable.SelectionChanged) -> None:
        # A highlight queued just before an exit may arrive once the screen is gone.
        with contextlib.suppress(NoMatches):
            self._select(message.name, previous=False)

    @on(NodeGridTable.InstanceChosen)
    def _on_grid_choice(self, message: NodeGridTable.InstanceChosen) -> None:
        self._choose(message.name)
        self.query_one(InstancesTable).focus()

    @on(FilterBar.Changed)
    def _on_filter(self, message: FilterBar.Changed) -> None:
        # A filter walks every row once (80,000 in a large job): do it once typing pauses.
        if self._filter_timer is not None:
            self._filter_timer.stop()
        value = message.value
        self._filter_timer = self.set_timer(
            FILTER_DELAY, lambda: self.query_one(InstancesTable).set_filter(value)
        )

    @on(FilterBar.Closed)
    def _on_filter_closed(self) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        table = self.query_one(InstancesTable)
        table.set_filter(self.query_one(FilterBar).value)
        table.focus()

    # -- the job in this process (`srtr up`) ---------------------------------------------

    def _job_finished(self) -> None:
        with contextlib.suppress(NoMatches):  # the App may be closing already
            self._on_job_end()

    def _on_job_end(self) -> None:
        assert self.job is not None
        code = job_end.job_code(self.job)
        if code is None:
            self.exit(1)  # run_with_tui re-raises the exception once the terminal is back
            return
        self._job_code = code
        self._wake.set()  # show the final state.json at once
        end = job_end.on_job_end(
            code,
            quit_when_done=self._quit_when_done,
            terminal_gone=self._terminal_gone,
            teardown_sent=self._teardown_sent,
            since_last_key=time.monotonic() - self._last_key_at,
            exit_after=self.exit_after,
        )
        if end.exit_now:
            self.exit(code)
            return
        self._banner = end.banner
        if end.close_after is not None:
            # A countdown, not one timer: the banner says how long is left, second by second.
            self._close_at = time.monotonic() + end.close_after
            self._exit_timer = self.set_interval(CLOSE_TICK, self._count_down)
        self.refresh_bindings()  # no intents on an ended job: out of the footer
        self.query_one(JobHeader).show(self.frame.header if self.frame else None, self._banner)

    def _count_down(self) -> None:
        left = self._close_at - time.monotonic()
        if left <= 0:
            if self._exit_timer is not None:
                self._exit_timer.stop()
            self.exit(self._job_code)
            return
        banner = job_end.closing_banner(self._exit_code(), left)
        if banner != self._banner:
            self._banner = banner
            with contextlib.suppress(NoMatches):
                header = self.frame.header if self.frame else None
                self.query_one(JobHeader).show(header, self._banner)

    def on_key(self, event: Key) -> None:
        self._last_key_at = time.monotonic()
        if self._exit_timer is not None:
            self._exit_timer.stop()
            self._exit_timer = None
            self._banner = job_end.ended_banner(self._exit_code())
            with contextlib.suppress(NoMatches):
                header = self.frame.header if self.frame else None
                self.query_one(JobHeader).show(header, self._banner)

    # -- actions (the intents' are in app_intents.py) -------------------------------------

    def action_filter(self) -> None:
        if self.screen.maximized is not None:
            # The instance filter is hidden behind the full-screen log: `/` searches the log.
            self.query_one(LogView).action_search()
            return
        self.query_one(FilterBar).open()

    def action_escape(self) -> None:
        if self.screen.maximized is not None:
            self._leave_full_log()
        elif self._plan_pending:
            self._send("discard", None)

    @property
    def _plan_pending(self) -> bool:
        return self.frame is not None and self.frame.plan is not None and self.frame.plan.pending

    def action_apply_plan(self) -> None:
        # The plan panel on screen is the preview the user confirms with this key.
        if not self._plan_pending:
            self.notify("no recipe edit is waiting", severity="warning")
            return
        self._send("apply", None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply_plan":
            return self._plan_pending  # in the footer only while an edit waits
        if action == "detach":
            return self.job is not None and self.job_running  # only `srtr up` has a job to leave
        if action in intents.INTENT_ACTIONS:
            return self.job_running  # an ended job takes no intents: not offered at all
        return True

    def action_zoom_log(self) -> None:
        if self.screen.maximized is not None:
            self._leave_full_log()
        else:
            # The full-screen log takes the keys at once (PageUp, Home, /, n...); Esc or `l`
            # gives them back to the pane that had them.
            log = self.query_one(LogView)
            self._focus_before_log = self.focused if self.focused is not log else None
            self.screen.maximize(log)
            # At once, not after the queue (`focus()`): a key typed right after `l` is the log's.
            self.screen.set_focus(log, scroll_visible=False)

    def _leave_full_log(self) -> None:
        self.screen.minimize()
        before = self._focus_before_log
        if before is not None and before.is_attached:
            before.focus()
        self._focus_before_log = None

    @on(LogView.LoadEarlier)
    def _on_load_earlier(self) -> None:
        self.source.want_earlier = self.source.want_log
        self._wake.set()

    @property
    def detached(self) -> bool:
        """The user detached (`d`): the job goes on headless once the App is gone."""
        return self._detached

    def action_detach(self) -> None:
        if self.job is None or not self.job_running:
            return
        self._detached = True
        self.exit(None)

    def action_cycle_theme(self) -> None:
        self.theme = themes.following(self.theme)
        self.notify(f"theme: {themes.short_name(self.theme)}", timeout=1.5)

    def action_focus_events(self) -> None:
        self.query_one(EventsPane).focus()

    def action_previous_log(self) -> None:
        want = self.source.want_log
        if want is None:
            self.notify("select an instance first", severity="warning")
            return
        self._select(want[0], previous=not want[2])

    def action_follow(self) -> None:
        following = self.query_one(LogView).toggle_follow()
        self.notify("following the log" if following else "log paused", timeout=1.5)

    def action_help(self) -> None:
        note = intents.help_note(job_running=self.job_running, in_process=self.job is not None)
        self.push_screen(HelpScreen(keys.help_keys(self.BINDINGS, self.OTHER_KEYS), note))
