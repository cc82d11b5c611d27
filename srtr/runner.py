"""Run one job: wire the store, controllers, a backend, the run dir files and the control socket.

`srtr up` calls `run_job` on the event loop (headless) or inside the TUI's loop. The backend
is chosen and constructed by the caller; this module only drives it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path

from rich.console import Console

from srtr.backends.base import Backend
from srtr.backends.prober import Prober
from srtr.control import ControlServer
from srtr.controllers import intents, manager
from srtr.controllers.context import Ctx
from srtr.progress import ProgressPrinter
from srtr.reconciler.clock import MonotonicClock
from srtr.reconciler.persist import EventLog, snapshot, write_atomic
from srtr.reconciler.store import Store
from srtr.reconciler.workqueue import WorkQueue
from srtr.resources.objects import DesiredState

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
) -> int:
    """Run `desired` on `backend` until the job ends; return the job's exit code.

    Writes state.json, events.jsonl and logs/srtr.log in `run_dir`, serves the control
    socket, and turns SIGINT/SIGTERM/SIGHUP into a graceful teardown (a second one kills).
    With `progress`, one line per event goes to stdout (headless mode).
    """
    logger, handler = _file_logger(run_dir)
    console = Console(highlight=False)
    clock = MonotonicClock()
    store = Store(desired, clock)
    events = EventLog(run_dir / "events.jsonl")
    store.subscribe_events(events)
    store.subscribe_events(
        lambda e: logger.info("%s %s %s: %s", e.type, e.reason, e.object, e.message)
    )
    if progress:
        store.subscribe_events(ProgressPrinter(console, len(desired.instances)))
    ctx = Ctx(
        store=store,
        backend=backend,
        clock=clock,
        queue=WorkQueue(clock),
        prober=Prober(),
        run_dir=run_dir,
    )
    control = ControlServer(
        run_dir, lambda op, name: intents.handle(ctx, op, name), intents.IntentError
    )
    await control.start()
    loop = asyncio.get_running_loop()
    pending: list[asyncio.TimerHandle] = []

    def persist() -> None:
        pending.clear()
        doc = snapshot(
            store, backend=backend.name, controller_pid=os.getpid(), slurm_job_id=slurm_job_id
        )
        doc["job"]["control"] = str(control.path)
        write_atomic(run_dir / "state.json", json.dumps(doc, indent=1) + "\n")

    def on_change() -> None:
        if not pending:
            pending.append(loop.call_later(PERSIST_PERIOD, persist))

    store.subscribe_changes(on_change)
    _announce(store, desired, backend, run_dir)
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, manager.request_stop, ctx, signum)
    persist()
    try:
        code = await manager.run(ctx)
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        for handle in pending:
            handle.cancel()
        await control.close()
        persist()
        events.close()
        logger.removeHandler(handler)
        handler.close()
    if progress:
        console.print(f"run dir: {run_dir}  (srtr status {run_dir})")
    return code


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
