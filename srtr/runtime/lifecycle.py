"""Run one job: the store, the controllers' manager, and the side tasks around them.

`srtr up` calls `run_job` on the event loop (headless) or inside the TUI's loop; the backend
is chosen and constructed by the caller (`runtime.assembly`), this module only drives it.

`Lifecycle` starts the side tasks (`side_tasks`) in a fixed order and, when the
job ends or anything fails, stops the ones that started in reverse order, each once, so a
failing stop never skips the others. The order is the dependency graph: the state file
starts before the control socket and the metrics whose addresses it records, and writes
last, after they have stopped.
"""

from __future__ import annotations

import errno
import logging
import signal
from pathlib import Path
from typing import Protocol

from srtr.backends.base import Backend
from srtr.backends.cgroups import limits_warning
from srtr.backends.prober import Prober
from srtr.controllers import manager
from srtr.controllers.context import Ctx
from srtr.controllers.context import Prober as CtxProber
from srtr.reconciler.clock import MonotonicClock
from srtr.reconciler.workqueue import WorkQueue
from srtr.resources.objects import DesiredState
from srtr.runtime import descriptors, run_lock
from srtr.runtime.gc_freeze import Freezer
from srtr.runtime.job_options import JobOptions
from srtr.runtime.progress import detach_terminal
from srtr.runtime.run_files import EventFile, LogFile, RunDir, stderr_note
from srtr.runtime.side_tasks import (
    Adoption,
    ControlSocket,
    Guard,
    Heartbeat,
    OwnMetrics,
    Progress,
    RecipeWatch,
    StateFile,
    StopSignals,
)
from srtr.runtime.targets_file import TargetsFile
from srtr.store.store import Store

log = logging.getLogger("srtr")


class SideTask(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Lifecycle:
    """Ordered start; reverse-ordered stop of what started, whatever fails on the way."""

    def __init__(self) -> None:
        self._started: list[SideTask] = []

    async def start(self, task: SideTask) -> None:
        await task.start()
        self._started.append(task)

    async def stop(self) -> None:
        while self._started:
            task = self._started.pop()
            try:
                await task.stop()
            except Exception:  # one failing stop must not leave the others running
                log.exception("stopping the %s failed", task.name)


def new_ctx(
    desired: DesiredState,
    run_dir: Path,
    backend: Backend,
    recipe_text: str,
    prober: CtxProber | None = None,
) -> Ctx:
    clock = MonotonicClock()
    store = Store(desired, clock)
    store.recipe_text = recipe_text
    return Ctx(
        store=store,
        backend=backend,
        clock=clock,
        queue=WorkQueue(clock),
        prober=prober or Prober(),
        run_dir=run_dir,
    )


def side_tasks(ctx: Ctx, options: JobOptions) -> list[SideTask]:
    """The job's side tasks, in start order (see the module docstring)."""

    def hangup(error: int | None) -> None:
        """stdout died under a headless job. A pipe whose reader left (`srtr up | head`)
        is what SIGPIPE says to any CLI: stop, quietly, 141. Anything else (EIO: the
        terminal is gone) is a hang-up, as SIGHUP: 129."""
        detach_terminal()
        manager.request_stop(ctx, signal.SIGPIPE if error == errno.EPIPE else signal.SIGHUP)

    run_dir, state, targets = RunDir(ctx), StateFile(ctx, options), TargetsFile(ctx)
    # A recreated run dir gets its files again (the control socket reopens on its own).
    run_dir.on_recreated += [state.rewrite_all, targets.rewrite]
    note = stderr_note if options.progress else _silent  # the TUI owns the terminal
    tasks: list[SideTask] = [run_dir, EventFile(ctx, note), LogFile(ctx)]
    if options.progress:
        tasks.append(Progress(ctx, on_lost=hangup))
    tasks += [state, ControlSocket(ctx, options, state, run_dir), Heartbeat(ctx)]
    if options.metrics_listen is not None:
        tasks.append(OwnMetrics(ctx, options.metrics_listen, state))
    tasks += [Announcement(ctx), targets, StopSignals(ctx, note)]
    if options.adopt_from is not None:
        tasks.append(Adoption(ctx, options.adopt_from))
    tasks += [Guard(ctx, options, state), FirstWrite(state)]
    if options.recipe is not None:
        tasks.append(RecipeWatch(ctx, options))
    return tasks


def _silent(_text: str) -> None:
    return None


async def run_job(
    desired: DesiredState,
    run_dir: Path,
    backend: Backend,
    options: JobOptions,
    prober: CtxProber | None = None,
) -> int:
    """Run `desired` on `backend` until the job ends; return the job's exit code.

    `prober` runs readiness probes (default: here, `backends.prober.Prober`; the agent
    backend's runs them on the nodes).

    Writes state.json, events.jsonl and logs/srtr.log in `run_dir`, serves the control
    socket, and turns SIGINT/SIGTERM/SIGHUP into a graceful teardown (a second SIGINT or
    SIGTERM kills).
    """
    # The soft limit raised; a job that cannot fit refused.
    descriptors.check_desired(desired, backend.capabilities.descriptors)
    run_lock.hold(run_dir)  # never two controllers of one run dir: refused here, at once
    ctx = new_ctx(desired, run_dir, backend, options.recipe_text, prober)
    ctx.source_pins = options.source_pins
    lifecycle = Lifecycle()
    freezer = Freezer()
    try:
        for task in side_tasks(ctx, options):
            await lifecycle.start(task)
        freezer.start()  # what lives as long as the job, out of the collector's passes
        return await manager.run(ctx)
    finally:
        await lifecycle.stop()
        freezer.stop()
        run_lock.release(run_dir)


class Announcement:
    """The job's first events: plan warnings, ignored containers, Started."""

    name = "announcement"

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    async def start(self) -> None:
        store, desired, backend = self.ctx.store, self.ctx.store.desired, self.ctx.backend
        _announce(store, desired, backend, self.ctx.run_dir)

    async def stop(self) -> None:
        return None


class FirstWrite:
    """state.json exists once everything is up, before the first reconcile."""

    name = "first state.json"

    def __init__(self, state: StateFile) -> None:
        self.state = state

    async def start(self) -> None:
        self.state.write()

    async def stop(self) -> None:
        return None


def _announce(store: Store, desired: DesiredState, backend: Backend, run_dir: Path) -> None:
    for warning in (*desired.warnings, *desired.line_warnings):
        store.record("job", "PlanWarning", warning, warning=True)
    if not backend.capabilities.containers:
        for image in sorted({s.container for s in desired.instances if s.container}):
            users = sorted({s.service for s in desired.instances if s.container == image})
            store.record(
                "job",
                "NoContainers",
                f"container {image!r} of {', '.join(users)} is ignored: the {backend.name} "
                "backend runs these instances on the host",
                warning=True,
            )
    limited = sorted({s.service for s in desired.instances if s.memory_limit})
    unenforced = limits_warning(limited, backend.capabilities.simulated_nodes)
    if unenforced:
        store.record("job", "NoMemoryLimits", unenforced, warning=True)
    store.record(
        "job",
        "Started",
        f"{desired.job_name}: {len(desired.instances)} instance(s) on "
        f"{len(desired.nodes.allocation)} {backend.name} node(s); run dir {run_dir}",
    )
