"""The Prometheus targets file (`prometheus/targets.json`) and the kinds' run files: views of
the store, written by a side task.

The exporter controller decides what the targets file lists (`ExporterStatus.text`, at most
one change per `exporter.WRITE_PERIOD`); this writes it, atomically, whenever the store says
it changed. A write that fails is a write fault (an event), tried again every `WRITE_RETRY`;
the file keeps what it listed. The config files the job's kinds name in their commands (the
process exporter's group file) are written once each, before any instance of those kinds
launches: at start, and when a live edit (a new generation) brings new ones.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from srtr.controllers import exporter
from srtr.controllers.context import Ctx
from srtr.reconciler.clock import TimerHandle
from srtr.runtime.run_files import RETRY_PERIOD
from srtr.store.persist import write_atomic

WRITE_RETRY = RETRY_PERIOD  # while the targets file cannot be written (a full disk)


class TargetsFile:
    """A side task: writes the targets file and the kinds' run files from the store."""

    name = "exporters"

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self._generation = -1
        self._retry: TimerHandle | None = None
        self._stopped = False

    async def start(self) -> None:
        self.attach()
        exporter.start(self.ctx)  # skip kinds whose program is missing; list the targets

    def attach(self) -> None:
        """Follow the store from now on (and write the run files at once)."""
        exporter.state_of(self.ctx.store)
        self.ctx.store.subscribe_changes(self._on_change)
        self._on_change()

    async def stop(self) -> None:
        self.finish()

    def finish(self) -> None:
        """After the job: list only what still runs (nothing, normally), so Prometheus lets
        go; nothing is written after this."""
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()
        state = self.ctx.store.exporters
        if state is None or state.written is None:
            return
        text = exporter.targets_text(self.ctx.store, exporter.listed(self.ctx.store))
        if text != state.written:
            state.text = text
            self._write_targets()

    def rewrite(self) -> None:
        """The run dir was recreated: every file is written again."""
        state = self.ctx.store.exporters
        if state is not None:
            state.run_files.clear()
            state.written = None
        self._generation = -1
        self._on_change()

    def _on_change(self) -> None:
        if self._stopped:
            return
        store = self.ctx.store
        if store.job.generation != self._generation:
            self._generation = store.job.generation
            self._write_run_files()
        state = store.exporters
        if state is not None and state.text is not None and state.text is not state.written:
            self._write_targets()

    def _write_run_files(self) -> None:
        """A write that fails is a write fault, not a crash: the exporter that needs the file
        then fails to start and says why in its log."""
        store = self.ctx.store
        done = exporter.state_of(store).run_files
        for path, text in exporter.run_files(store).items():
            if path in done:
                continue
            target = self.ctx.run_dir / path

            def write(target: Path = target, text: str = text) -> None:
                target.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(target, text)

            if store.write_faults.attempt(path, write):
                done.add(path)

    def _write_targets(self) -> None:
        store = self.ctx.store
        state = store.exporters
        assert state is not None and state.text is not None
        text, path = state.text, self.ctx.run_dir / exporter.TARGETS_FILE

        def write() -> None:
            path.parent.mkdir(exist_ok=True)  # a vanished run dir is recreated by the faults
            write_atomic(path, text)

        if store.write_faults.attempt(exporter.TARGETS_FILE, write):
            state.written = text
            state.writes += 1
        elif self._retry is None and not self._stopped:
            with contextlib.suppress(RuntimeError):  # no loop: the next change tries again
                clock = self.ctx.clock
                self._retry = clock.call_at(clock.now() + WRITE_RETRY, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self._on_change()
