"""The side tasks of a running job, one class each, started and stopped by `lifecycle`.

Each has `start()` and `stop()`; `Lifecycle` starts them in order and stops the started ones
in reverse, whatever fails. Who depends on whom is the start order: `StateFile` reads the
control channel's addresses and the metrics URL when it writes, so those start after it and
stop before its final write; the heartbeat starts after the control channel (a beat says
"drive me": control.json must be there) and its last beat says the controller stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.controllers import grow, instance, intents, manager
from srtr.controllers.context import Ctx
from srtr.net import certs
from srtr.runtime import adoption, guard
from srtr.runtime.control import ControlServer, advertised_hosts
from srtr.runtime.progress import ProgressPrinter, RawOut
from srtr.runtime.recipe_watch import RecipeWatcher
from srtr.runtime.run_files import RETRY_PERIOD, RunDir
from srtr.store.cause_block import failed_job_block
from srtr.store.persist import head, write_atomic
from srtr.store.rundir import (
    HEARTBEAT_FILE,
    HEARTBEAT_PERIOD,
    HeartbeatDoc,
    StateDoc,
    machine_id,
)
from srtr.store.state_log import StateWriter
from srtr.store.store import JobPhase

if TYPE_CHECKING:
    from srtr.runtime.job_options import JobOptions
    from srtr.runtime.metrics import JobMetrics

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Coalesce bursts (a stage of 4,096 launches) into one state.json write per period.
PERSIST_PERIOD = 0.2
ENDED = (JobPhase.SUCCEEDED, JobPhase.FAILED)
WRITE_SPACING = 8  # the pause after a state.json write, in units of that write's time
# ... but at most this many seconds after a big job's snapshot (~1.5 s at 80,000 instances):
# the writes after it are deltas that cost a fraction of it, and spaced by the snapshot the
# last of a launch came ~12 s later, into what should be the job's idle time.
MOST_SPACED = 3.0


class Progress:
    """Headless `srtr up`: one line per event on stdout. A dead stdout is a hang-up.

    A stdout that is a file which cannot be written (a full disk) only drops lines: that is
    a write fault, reported once (and on stderr, when it is another file).
    """

    name = "progress lines"
    TARGET = "stdout"

    def __init__(self, ctx: Ctx, on_lost: Callable[[int | None], None]) -> None:
        self.ctx = ctx
        self.on_lost = on_lost
        self.printer: ProgressPrinter | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        faults = self.ctx.store.write_faults

        def soon(callback: Callable[..., None], *args: Any) -> None:  # from the printer's thread
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(callback, *args)

        count = len(self.ctx.store.desired.instances)
        dropped = "progress lines are dropped while it fails; events.jsonl keeps every event"
        self.printer = ProgressPrinter(
            RawOut(1).console(),
            count,
            on_lost=lambda errno: soon(self.on_lost, errno),
            on_fault=lambda exc: soon(faults.failed, self.TARGET, exc, dropped),
            on_recovered=lambda: soon(faults.ok, self.TARGET),
        )
        self.ctx.store.subscribe_events(self.printer)

    async def stop(self) -> None:
        if self.printer is not None:
            run_dir = self.ctx.run_dir
            for line in failed_job_block(run_dir, self.ctx.store.job):
                self.printer.print(line)
            self.printer.print(f"run dir: {run_dir}  (srtr status {run_dir})")
            self.printer.close()


class StateFile:
    """state.json, written after changes (`state_log.StateWriter`: whole and atomic for
    ordinary jobs, a snapshot and a delta log for big ones); recipes/gen-N.yaml per
    generation.

    A write that fails leaves the previous files in place and is tried again every
    `RETRY_PERIOD` until it works; the fault is reported once (`write_faults`).
    """

    name = "state.json"
    TARGET = "state.json"
    RECIPE_TARGET = "recipe.yaml"

    def __init__(self, ctx: Ctx, options: JobOptions) -> None:
        self.ctx = ctx
        self.options = options
        self.control_path: Path | None = None
        self.control_addresses: list[str] = []
        self.metrics: JobMetrics | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._saved_generation = 0
        self._last_write = 0.0
        self._stopped = False
        self._ended = False  # the job's end was written (`_on_change`)
        faults = ctx.store.write_faults
        self.writer = StateWriter(ctx.run_dir, restore=faults.restore_run_dir)

    def mirror_to(self, mirror: guard.StateMirror) -> None:
        """Copy every write to `mirror` too (the guard's), starting with the last one."""
        self.writer.attach(mirror)

    async def start(self) -> None:
        self.ctx.store.subscribe_changes(self._on_change)

    async def stop(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._stopped = True
        self.writer.finish()  # a big job's state.json: whole and current once it is over
        self.write()
        self.writer.close()

    def rewrite_all(self) -> None:
        """The run dir was recreated: the recipe copies and state.json are written again."""
        self._saved_generation = 0
        self.writer.invalidate()
        self._on_change()

    def _on_change(self) -> None:
        if not self._ended and self.ctx.store.job.phase in ENDED:
            # Over: its last state once the agents are told to end (`_write_last`).
            self._ended = True
            self.writer.finish()
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None
            self.ctx.when_closing(self._write_last)
            return
        self._schedule(PERSIST_PERIOD)

    def _write_last(self) -> None:
        """The job is over and the agents were told to end: its last state now, while they
        say goodbye (a big job's whole state.json is seconds of CPU), not before they are
        told nor after them; `stop` writes again only if something changed since. A timer:
        the close's messages leave first (each connection flushes in a callback)."""
        if not self._stopped:
            self._pending = asyncio.get_running_loop().call_later(0, self.write)

    def _schedule(self, period: float) -> None:
        if self._pending is None and not self._stopped:
            if self.TARGET in self.ctx.store.write_faults.failing:
                period = max(period, RETRY_PERIOD)
            # A write blocks the loop; space writes out as they get slower (big jobs), so that
            # they take at most 1/(1 + WRITE_SPACING) of it (~11 %: a 4,096-instance job
            # launching 1,024 hollow agents spent 20 % of its launch writing at 4 ×).
            spacing = WRITE_SPACING * self._last_write
            if self.writer.compacted:
                spacing = min(spacing, MOST_SPACED)
            delay = max(period, spacing)
            self._pending = asyncio.get_running_loop().call_later(delay, self.write)

    def write(self) -> None:
        if self._pending is not None:
            # A direct write (the first, the last) is the one that was due: left pending, its
            # timer started a second chain of writes that never ended (twice the writes).
            self._pending.cancel()
            self._pending = None
        store, faults, run_dir = self.ctx.store, self.ctx.store.write_faults, self.ctx.run_dir
        generation = store.job.generation
        if generation != self._saved_generation and store.recipe_text:
            text = store.recipe_text
            if faults.attempt(self.RECIPE_TARGET, lambda: _save_recipe(run_dir, text, generation)):
                self._saved_generation = generation
        was_failing = self.TARGET in faults.failing  # and so says the document
        # The snapshot counts: at 4,096 instances it costs as much as the dumps.
        started = time.monotonic()
        sections = dict(self._document())
        written = faults.attempt(self.TARGET, lambda: self.writer.write(sections, store))
        self._last_write = time.monotonic() - started
        if written and was_failing and self._stopped:
            self.write()  # the last word must not be a fault that has just ended
            return
        recipe_due = bool(store.recipe_text) and generation != self._saved_generation
        if not written or recipe_due:
            self._schedule(RETRY_PERIOD)
        elif (due := self.writer.due_in()) is not None:  # a big job's summary.json waits
            self._schedule(due)

    def _document(self) -> StateDoc:
        store, options, backend = self.ctx.store, self.options, self.ctx.backend
        doc = head(
            store,
            backend=backend.name,
            controller_pid=os.getpid(),
            slurm_job_id=options.slurm_job_id,
        )
        job = doc["job"]
        if self.control_path is not None:  # once the control socket has started, if any
            job["control"] = str(self.control_path)
        if self.control_addresses:
            job["control_addresses"] = self.control_addresses
        job["controller_host"] = socket.gethostname()
        job["recipe_path"] = str(options.recipe.resolve()) if options.recipe else None
        job["owns_allocation"] = backend.owns_allocation
        job["metrics_url"] = self.metrics.url if self.metrics else None
        if options.launcher:
            job["launcher"] = options.launcher
        if options.network is not None:
            job["network"] = options.network.cidr
        return doc


def _save_recipe(run_dir: Path, text: str, generation: int) -> None:
    """recipe.yaml is the recipe as last applied; recipes/ keeps every generation."""
    history = run_dir / "recipes"
    history.mkdir(exist_ok=True)
    write_atomic(history / f"gen-{generation}.yaml", text)
    write_atomic(run_dir / "recipe.yaml", text)


class ControlSocket:
    """The control channel (`runtime.control`): TLS on every address, control.json (0600)
    with its addresses and credential, and the same-host 0600 socket when it fits.

    When the run dir is recreated (it vanished with control.json in it), it writes the file
    and listens at the socket again, so `srtr down` and the TUI's keys keep working.
    """

    name = "control channel"

    def __init__(self, ctx: Ctx, options: JobOptions, state: StateFile, run_dir: RunDir) -> None:
        self.ctx = ctx
        self.options = options
        self.state = state
        self.server: ControlServer | None = None
        self.reopening: asyncio.Task[None] | None = None
        run_dir.on_recreated.append(self._reopen)

    async def start(self) -> None:
        ctx = self.ctx
        cert = self.options.cert or certs.for_job(ctx.run_dir)
        self.server = ControlServer(
            ctx.run_dir,
            lambda op, name, node: intents.handle(ctx, op, name, node),
            intents.IntentError,
            context=cert.server_context(),
            fingerprint=cert.fingerprint,
            hosts=advertised_hosts([n.ip for n in ctx.backend.nodes()]),
        )
        await self.server.start()
        self.state.control_path = self.server.path
        self.state.control_addresses = self.server.addresses

    def _reopen(self) -> None:
        if self.reopening is None or self.reopening.done():
            self.reopening = asyncio.ensure_future(self._listen_again())

    async def _listen_again(self) -> None:
        if self.server is None:
            return
        try:
            await self.server.reopen()
        except OSError as exc:
            self.ctx.store.write_faults.failed(
                "control.json", exc, "`srtr down` and the TUI's keys cannot reach the job"
            )

    async def stop(self) -> None:
        if self.reopening is not None:
            self.reopening.cancel()
        if self.server is not None:
            await self.server.close()


class Heartbeat:
    """heartbeat.json, rewritten every `HEARTBEAT_PERIOD`: how any host that sees the run dir
    knows this controller runs (`runtime.liveness`), with no pid and no socket.

    A rename of a small file a second: cheap, and readers see a whole beat or the previous
    one. No fsync: a beat lost to a crash is a beat a reader must not believe anyway. A
    write that fails is a write fault (reported once), tried again at the next beat.
    """

    name = "heartbeat"
    TARGET = HEARTBEAT_FILE

    def __init__(self, ctx: Ctx, period: float = HEARTBEAT_PERIOD) -> None:
        self.ctx = ctx
        self.period = period
        self._timer: asyncio.TimerHandle | None = None
        self._host = socket.gethostname()
        self._machine = machine_id()

    async def start(self) -> None:
        self._beat()

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._write(stopped=True)

    def _beat(self) -> None:
        self._write(stopped=False)
        self._timer = asyncio.get_running_loop().call_later(self.period, self._beat)

    def _write(self, *, stopped: bool) -> None:
        doc: HeartbeatDoc = {
            "ts": time.time(),
            "period": self.period,
            "host": self._host,
            "machine": self._machine,
            "pid": os.getpid(),
            "stopped": stopped,
        }
        path = self.ctx.run_dir / HEARTBEAT_FILE
        text = json.dumps(doc, separators=(",", ":")) + "\n"
        self.ctx.store.write_faults.attempt(self.TARGET, lambda: _replace(path, text))


def _replace(path: Path, text: str) -> None:
    """Write `path` by rename (whole or not at all), without the fsync of `write_atomic`."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class OwnMetrics:
    """srtr's own Prometheus metrics (`--metrics-port`). A taken port never costs the job."""

    name = "metrics"

    def __init__(self, ctx: Ctx, listen: tuple[str, int], state: StateFile) -> None:
        self.ctx = ctx
        self.listen = listen
        self.state = state
        self.metrics: JobMetrics | None = None

    async def start(self) -> None:
        from srtr.runtime.metrics import JobMetrics

        metrics = JobMetrics(self.ctx.store, self.ctx.queue, self.ctx.clock)
        try:
            metrics.serve(*self.listen)
        except OSError as exc:
            metrics.close()
            host, port = self.listen
            message = f"cannot serve metrics on {host}:{port}: {exc}"
            self.ctx.store.record("job", "MetricsFailed", message, warning=True)
            return
        metrics.attach(self.ctx)
        self.metrics = self.state.metrics = metrics

    async def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.refresh()
            self.metrics.close()


class StopSignals:
    """SIGINT/SIGTERM/SIGHUP: a graceful teardown; a second SIGINT or SIGTERM kills."""

    name = "signal handlers"

    def __init__(self, ctx: Ctx, note: Callable[[str], None] = lambda text: None) -> None:
        self.ctx = ctx
        self.note = note  # headless: stderr; under the TUI nothing (it says it itself)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self._stop, signum)

    def _stop(self, signum: int) -> None:
        first = not self.ctx.store.job.teardown_requested
        manager.request_stop(self.ctx, signum)
        if first and signum in (signal.SIGINT, signal.SIGTERM):
            # A graceful teardown may take a tier's whole grace: say how not to wait.
            again = "Ctrl+C" if signum == signal.SIGINT else "SIGTERM"
            self.note(f"srtr: tearing down gracefully; {again} again kills everything now")

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


class Adoption:
    """`srtr up --adopt`: take over what a crashed controller left running (0 restarts)."""

    name = "adoption"

    def __init__(self, ctx: Ctx, state: dict[str, Any]) -> None:
        self.ctx = ctx
        self.state = state

    async def start(self) -> None:
        ctx = self.ctx
        # Listen before adopting: the backend reports what it learns (step ids) at once.
        ctx.backend.set_listener(lambda obs: instance.observe(ctx, obs))
        await adoption.adopt(ctx, self.state)

    async def stop(self) -> None:
        return None


class Guard:
    """The job's guard process: kills orphans if no controller adopts them in time, and
    releases the allocation srtr made. `srtr up` may have started it already (before salloc
    was granted: `options.early_guard`); then this only hands it the state mirror."""

    name = "guard"

    def __init__(self, ctx: Ctx, options: JobOptions, state: StateFile) -> None:
        self.ctx = ctx
        self.options = options
        self.state = state
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        started = self.options.early_guard
        if started is None:
            owned = self.options.slurm_job_id if self.ctx.backend.owns_allocation else None
            network = self.options.network
            started = guard.start_mirrored(
                self.ctx.run_dir,
                self.options.adopt_window,
                owned,
                hold=network.fds() if network is not None else (),
            )
        self.state.mirror_to(started.mirror)
        self.process = started.process

    async def stop(self) -> None:
        if self.process is not None:
            self.process.poll()  # it sees our exit and leaves on its own; no zombie meanwhile


class RecipeWatch:
    """Live edits: saves of the recipe file are recorded, then planned (the `recipe` key),
    and applied or held for a yes; with a provisioner, edits may grow the job (`grow`)."""

    name = "recipe watcher"

    def __init__(self, ctx: Ctx, options: JobOptions) -> None:
        assert options.recipe is not None
        self.ctx = ctx
        self.options = options
        self.recipe = options.recipe
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        options, store = self.options, self.ctx.store
        recipe = store.recipe
        recipe.path, recipe.auto = str(self.recipe), options.apply_auto
        recipe.no_grow = options.no_grow
        recipe.planned = recipe.text  # what runs was planned from it: no edit yet
        store.grow.nodes = list(options.allocation)
        store.grow.provisioned = frozenset(options.provisioned)
        if options.provisioner is not None:
            grow.setup(self.ctx, options.provisioner)
        watcher = RecipeWatcher(self.ctx, self.recipe, poll=options.watch_poll)
        self.task = asyncio.create_task(watcher.run(self.stopping))
        store.record(
            "job",
            "Watching",
            f"live edits of {self.recipe} are "
            + ("applied at once" if options.apply_auto else "shown for confirmation")
            + (" (polling)" if watcher.poll else ""),
        )

    async def stop(self) -> None:
        self.stopping.set()
        if self.task is not None:
            await asyncio.wait({self.task}, timeout=5)
        if self.ctx.provisioner is not None:  # nothing a grow request holds outlives the run
            await self.ctx.provisioner.close()
