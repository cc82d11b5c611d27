"""What the App's reading thread does: poll the run dir (`source.RunSource`) and build the
frame to show (`viewmodel.frame`) when state.json changed, or when asked to anyway (ages
tick). The App's event loop only applies the frames built here.

A large job's state takes long to read and build (tens of MB for 80,000 instances), and
under `srtr up` the job runs on the same host: after a snapshot that took `cost` seconds to
read and build, the next one is read no sooner than STATE_PAUSE × `cost` later, so the TUI
never takes more than a fifth of a core for it, and a small job is read at every poll as
before. Nor is a change paused once the job holds still (`_settled`: a big job's
summary.json says so, as of a change not read yet): a launch's last writes are read at once,
not seconds later when the job is idle. Events and the followed log are read at every poll
regardless. Under `srtr up` the reading thread also runs niced (`nice`), once the first
frame is up."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections import deque
from pathlib import Path

from srtr.store.rundir import RunState, read_summary
from srtr.tui import planned
from srtr.tui import viewmodel as vm
from srtr.tui.source import Poll, RunSource, controller_beats

STATE_PAUSE = 4.0  # × the cost of the last snapshot read and built: the pause before the next


class FrameReader:
    """The run dir's latest state and the frames built from it, in the reading thread."""

    def __init__(
        self,
        source: RunSource,
        run_dir: Path,
        *,
        watch_controller: bool,
        state: RunState | None = None,
    ) -> None:
        """`watch_controller`: read the controller's heartbeat to say whether it runs (not
        under `srtr up`, where it is this very process, nor in tests that fake a run dir).
        `state`: the snapshot `source` read already (the first frame shows it)."""
        self.source = source
        self._run_dir = run_dir
        self._watch_controller = watch_controller
        self.state: RunState | None = state
        # Each instance's last failed probe (state.json clears it once the probe passes).
        self.probe_failures = vm.remember_probe_failures({}, state.instances if state else [])
        self._built: vm.Frame | None = None  # the last frame built
        self._retired: deque[vm.Frame] = deque(maxlen=3)
        self._next_state_at = float("-inf")  # time.monotonic() from which to read state.json
        self._early = False  # the last look found the job holding still: read it now
        # Added to a reading thread's niceness before its next read (the App sets it once its
        # first frame is up, under `srtr up`). Linux nices one thread, not the process: the
        # App's own thread, which answers the keys, keeps its priority.
        self.nice = 0
        self._niced: set[int] = set()  # the reading threads niced already
        # Under `srtr up`: the descriptor of the job's plan (`planned.py`), the first frame
        # while there is no state.json yet; shown once.
        self.plan_fd: int | None = None

    def quiet(self) -> bool:
        """Nothing to read (a few stats): the loop need not hand a read to the thread."""
        self._early = time.monotonic() < self._next_state_at and self._settled()
        self.source.state_due = self._early or time.monotonic() >= self._next_state_at
        return self.plan_fd is None and self.source.unchanged()

    def _settled(self) -> bool:
        """The job holds still as of a change not read yet: its summary (a big job's
        summary.json, a few KB) says every instance is where it should be, at a later change
        than the state read. Its last writes are then read at once, not a pause later (a
        launch of 80,000 ends with writes of 20,000 records: the pause after reading one
        left the TUI catching up seconds after the job went idle)."""
        if self.state is None or self.state.seq is None or self.source.state_unchanged():
            return False
        summary = read_summary(self._run_dir)
        if summary is None or summary.get("not_desired_count") != 0:
            return False
        seq = summary.get("seq")
        return isinstance(seq, int) and seq > self.state.seq

    @property
    def warmed(self) -> bool:
        """The last frame has every row built: a read that finds nothing new builds only
        its header (ages tick), in microseconds."""
        return self._built is not None and vm.warmed(self._built)

    async def read_soon(
        self, now: float, rebuild_anyway: bool, quiet: bool
    ) -> tuple[Poll, vm.Frame | None]:
        """`read`, in a reading thread; on the caller's when nothing is new (`quiet`) and
        every row is built: the ages' frame then costs less than the hop."""
        if quiet and self.warmed:
            return self.read(now, rebuild_anyway)
        return await asyncio.to_thread(self._read_in_thread, now, rebuild_anyway)

    def _read_in_thread(self, now: float, rebuild_anyway: bool) -> tuple[Poll, vm.Frame | None]:
        """`read`, from a reading thread: the thread first yields the CPU (`nice`)."""
        tid = threading.get_native_id()
        if self.nice and tid not in self._niced:
            self._niced.add(tid)
            with contextlib.suppress(OSError):
                now_nice = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, now_nice + self.nice)
        return self.read(now, rebuild_anyway)

    def read(self, now: float, rebuild_anyway: bool) -> tuple[Poll, vm.Frame | None]:
        """Read what changed, and build the frame if there is one."""
        started = time.monotonic()
        self.source.state_due = self._early or started >= self._next_state_at
        self._early = False
        poll = self.source.poll()
        if self.plan_fd is not None:
            plan = self._plan(poll, now)
            if plan is not None:
                return poll, plan
        if poll.state is None and self.source.state_due and self._built is not None:
            # Once the state holds still: every row built, for a sort or a filter to read
            # (not while it changes: each change would be built twice, and the job wants
            # the process's time then).
            if not vm.warmed(self._built):
                vm.warm(self._built)
                gc.freeze()  # the rows just built, as the state's documents above
        state = poll.state or self.state
        # What changed is relative to the state read before, which the last frame shows.
        shown = None if self._built is None else self._built.state
        changed = poll.changed if self.state is not None and shown is self.state.doc else None
        if poll.state is not None:
            self.state = poll.state
        if state is None or (poll.state is None and not rebuild_anyway):
            return poll, None
        watched = self._watch_controller
        alive = controller_beats(self._run_dir, time.time()) if watched else True
        self._built = vm.frame(
            state.doc, now, controller_alive=alive, previous=self._built, changed=changed
        )
        if poll.state is not None:
            built = self._built.instances
            looked = built.values() if changed is None else [built[n] for n in changed]
            self.probe_failures = vm.remember_probe_failures(self.probe_failures, looked)
        # Freeing a 4,096-row frame takes milliseconds: hold the last few here so that the
        # last reference to an old frame is dropped in this thread, not in the UI's.
        self._retired.append(self._built)
        if poll.state is not None:
            # A big job's documents and rows are a million objects that live until they
            # are replaced: out of the cyclic collector's sight, which would otherwise walk
            # them all again and again as the screen's small garbage comes and goes. They
            # hold no cycles: reference counting still frees them when replaced.
            gc.freeze()
            ended = time.monotonic()
            self._next_state_at = ended + STATE_PAUSE * (ended - started)
        return poll, self._built

    def _plan(self, poll: Poll, now: float) -> vm.Frame | None:
        """The plan's frame, while no state.json was read (once: then state.json's frames
        follow; what they change is relative to the state read, never to the plan)."""
        fd, self.plan_fd = self.plan_fd, None
        if fd is None or poll.state is not None or self.state is not None:
            if fd is not None:
                os.close(fd)
            return None
        # A million new objects that live until the first state.json: the cyclic
        # collector's passes over them as they come would triple the time (as for a
        # snapshot, below).
        collecting = gc.isenabled()
        gc.disable()
        try:
            built = vm.frame(planned.read(fd), now)
        finally:
            if collecting:
                gc.enable()
        gc.freeze()
        return built
