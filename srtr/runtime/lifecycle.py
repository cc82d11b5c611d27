"""Run one job: wire the store, controllers, a backend, the run dir files and the control socket.

`srtr up` calls `run_job` on the event loop (headless) or inside the TUI's loop. The backend
is chosen and constructed by the caller; this module only drives it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from srtr.backends.base import Backend
from srtr.backends.prober import Prober
from srtr.controllers import exporter, instance, intents, manager
from srtr.controllers.context import Ctx
from srtr.controllers.job import begin_teardown
from srtr.reconciler.clock import MonotonicClock
from srtr.reconciler.persist import EventLog, snapshot, write_atomic
from srtr.reconciler.store import Store
from srtr.reconciler.workqueue import WorkQueue
from srtr.resources.objects import DesiredState
from srtr.runtime import adoption, guard
from srtr.runtime.control import ControlServer
from srtr.runtime.progress import ProgressPrinter, detach_terminal
from srtr.runtime.recipe_watch import RecipeWatcher

if TYPE_CHECKING:
    from srtr.runtime.metrics import JobMetrics

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Coalesce bursts (a stage of 4,096 launches) into one state.json write per period.
PERSIST_PERIOD = 0.2


def _file_logger(run_dir: Path) -> tuple[logging.Logger, logging.Handler]:
    logger = logging.getLogger("srtr")
    handler = logging.FileHandler(run_dir / "logs" / "srtr.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, handler


async def run_job(
    desired: DesiredState,
    run_dir: Path,
    backend: Backend,
    *,
    progress: bool = True,
    slurm_job_id: str | None = None,
    recipe: Path | None = None,
    recipe_text: str = "",
    allocation: Sequence[tuple[str, str]] = (),
    apply_auto: bool = True,
    watch_poll: bool | None = None,
    adopt_from: dict[str, Any] | None = None,
    adopt_window: float = guard.ADOPT_WINDOW,
    metrics_listen: tuple[str, int] | None = None,
) -> int:
    """Run `desired` on `backend` until the job ends; return the job's exit code.

    Writes state.json, events.jsonl and logs/srtr.log in `run_dir`, serves the control
    socket, and turns SIGINT/SIGTERM/SIGHUP into a graceful teardown (a second one kills).
    With `progress`, one line per event goes to stdout (headless mode). With `recipe`, saves
    of that file are live edits (see `recipe_watch`), applied at once when `apply_auto`.
    With `metrics_listen` (host, port), srtr's own metrics are served there (see `metrics`).
    """
    logger, handler = _file_logger(run_dir)
    console = Console(highlight=False)
    clock = MonotonicClock()
    store = Store(desired, clock)
    store.recipe_text = recipe_text
    events = EventLog(run_dir / "events.jsonl")
    store.subscribe_events(events)
    store.subscribe_events(
        lambda e: logger.info("%s %s %s: %s", e.type, e.reason, e.object, e.message)
    )
    loop = asyncio.get_running_loop()
    if progress:

        def stdout_lost() -> None:  # from the printer's thread
            loop.call_soon_threadsafe(hangup)

        printer = ProgressPrinter(console, len(desired.instances), on_lost=stdout_lost)
        store.subscribe_events(printer)
    ctx = Ctx(
        store=store,
        backend=backend,
        clock=clock,
        queue=WorkQueue(clock),
        prober=Prober(),
        run_dir=run_dir,
    )
    control = ControlServer(
        run_dir, lambda op, name, node: intents.handle(ctx, op, name, node), intents.IntentError
    )
    await control.start()
    # --- exporters and srtr's own metrics (issue 7) ---
    job_metrics: JobMetrics | None = None
    if metrics_listen is not None:
        from srtr.runtime.metrics import JobMetrics

        job_metrics = JobMetrics(store, ctx.queue, clock)
        try:
            job_metrics.serve(*metrics_listen)
            job_metrics.attach(ctx)
        except OSError as exc:  # a taken port must not cost the job: run it unobserved
            job_metrics.close()
            job_metrics = None
            host, port = metrics_listen
            message = f"cannot serve metrics on {host}:{port}: {exc}"
            store.record("job", "MetricsFailed", message, warning=True)
    # --- end ---

    def hangup() -> None:
        """stdout died under a headless job: the same as SIGHUP (the terminal is gone)."""
        detach_terminal()
        manager.request_stop(ctx, signal.SIGHUP)

    pending: list[asyncio.TimerHandle] = []
    saved_generation = [0]
    last_write = [0.0]

    def persist() -> None:
        pending.clear()
        if store.job.generation != saved_generation[0] and store.recipe_text:
            _save_recipe(run_dir, store.recipe_text, store.job.generation)
            saved_generation[0] = store.job.generation
        doc = snapshot(
            store, backend=backend.name, controller_pid=os.getpid(), slurm_job_id=slurm_job_id
        )
        doc["job"]["control"] = str(control.path)
        doc["job"]["recipe_path"] = str(recipe.resolve()) if recipe is not None else None
        allocation_info = getattr(backend, "allocation", None)
        doc["job"]["owns_allocation"] = bool(allocation_info and allocation_info.owned)
        doc["job"]["metrics_url"] = job_metrics.url if job_metrics else None  # issue 7
        started = time.monotonic()
        # Compact: at 4,096 instances indenting cost 130 ms of a 160 ms write (benchmarks/).
        write_atomic(run_dir / "state.json", json.dumps(doc, separators=(",", ":")) + "\n")
        last_write[0] = time.monotonic() - started

    def on_change() -> None:
        if not pending:
            # A write blocks the loop; space writes out as they get slower (big jobs).
            pending.append(loop.call_later(max(PERSIST_PERIOD, 4 * last_write[0]), persist))

    store.subscribe_changes(on_change)
    _announce(store, desired, backend, run_dir)
    exporter.start(ctx, shutil.which)  # issue 7: skip exporter kinds whose binary is missing
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, manager.request_stop, ctx, signum)
    if adopt_from is not None:
        # Listen before adopting: the backend reports what it learns (step ids) at once.
        backend.set_listener(lambda obs: instance.observe(ctx, obs))
        await adoption.adopt(ctx, adopt_from)
    guardian = guard.start(run_dir, adopt_window)
    end_time = await _end_time(backend)
    if end_time is not None:
        _plan_walltime(ctx, end_time, loop)
        store.extensions["end_time"] = end_time
    persist()
    stop_watching = asyncio.Event()
    watch_task: asyncio.Task[None] | None = None
    if recipe is not None:
        watcher = RecipeWatcher(ctx, recipe, allocation, auto=apply_auto, poll=watch_poll)
        watch_task = asyncio.create_task(watcher.run(stop_watching))
        store.record(
            "job",
            "Watching",
            f"live edits of {recipe} are "
            + ("applied at once" if apply_auto else "shown for confirmation")
            + (" (polling)" if watcher.poll else ""),
        )
    try:
        code = await manager.run(ctx)
    finally:
        stop_watching.set()
        guardian.poll()  # it sees our exit and leaves on its own; no zombie while we live
        if watch_task is not None:
            await asyncio.wait({watch_task}, timeout=5)
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        for handle in pending:
            handle.cancel()
        # --- issue 7: empty the targets file of a finished job; stop serving metrics ---
        exporter.finish(ctx)
        if job_metrics is not None:
            job_metrics.refresh()
            job_metrics.close()
        # --- end ---
        await control.close()
        persist()
        events.close()
        logger.removeHandler(handler)
        handler.close()
    if progress:
        printer.print(f"run dir: {run_dir}  (srtr status {run_dir})")
        printer.close()
    return code


# Teardown must start this long before the allocation ends, on top of every tier's grace:
# SLURM kills the job at the time limit whatever runs (KillWait after SIGTERM).
WALLTIME_MARGIN = 10.0


async def _end_time(backend: Backend) -> float | None:
    end_time = getattr(backend, "end_time", None)
    return await end_time() if end_time is not None else None


def teardown_budget(desired: DesiredState) -> float:
    """Seconds a graceful teardown may take: the longest grace of each tier, summed."""
    longest: dict[int, float] = {}
    for spec in desired.instances:
        tier = spec.shutdown_tier
        longest[tier] = max(longest.get(tier, 0.0), spec.stop_grace_seconds)
    return sum(longest.values())


def _plan_walltime(ctx: Ctx, end_time: float, loop: asyncio.AbstractEventLoop) -> None:
    """Start teardown early enough that every tier gets its grace before SLURM's limit."""
    budget = teardown_budget(ctx.store.desired) + WALLTIME_MARGIN
    delay = max(0.0, end_time - budget - ctx.clock.wall())

    def walltime() -> None:
        if ctx.store.job.teardown_requested:
            return
        holding = "benchmark" not in ctx.store.specs and not ctx.store.desired.terminal_services
        begin_teardown(
            ctx,
            exit_code=0 if holding else 1,
            reason=f"the allocation ends in {budget:.0f}s (time limit); walltime",
        )

    loop.call_later(delay, walltime)
    ctx.store.record(
        "job",
        "Walltime",
        f"the allocation ends at {time.strftime('%H:%M:%S', time.localtime(end_time))}"
        f"; teardown starts {budget:.0f}s before (tier graces + margin)",
    )


def _save_recipe(run_dir: Path, text: str, generation: int) -> None:
    """recipe.yaml is the recipe as last applied; recipes/ keeps every generation."""
    history = run_dir / "recipes"
    history.mkdir(exist_ok=True)
    write_atomic(history / f"gen-{generation}.yaml", text)
    write_atomic(run_dir / "recipe.yaml", text)


def _announce(store: Store, desired: DesiredState, backend: Backend, run_dir: Path) -> None:
    for warning in desired.warnings:
        store.record("job", "PlanWarning", warning, warning=True)
    if not getattr(backend, "supports_containers", False):
        for image in sorted({s.container for s in desired.instances if s.container}):
            users = sorted({s.service for s in desired.instances if s.container == image})
            store.record(
                "job",
                "NoContainers",
                f"container {image!r} of {', '.join(users)} is ignored: the {backend.name} "
                "backend runs these instances on the host",
                warning=True,
            )
    store.record(
        "job",
        "Started",
        f"{desired.job_name}: {len(desired.instances)} instance(s) on "
        f"{len(desired.nodes.allocation)} {backend.name} node(s); run dir {run_dir}",
    )
