"""The documents of the run dir's contract files: state.json and events.jsonl (its writer).

What they hold is modelled in `rundir.py` (`StateDoc`, `EventDoc`); this module builds those
documents from the store (`snapshot`, one function per section; `head` without the
instances and `instance_record` one instance, for the state writer) and writes events.jsonl.
state.json is written by `state_log.StateWriter`, which the runner (`srtr.runtime.lifecycle`)
drives on every change, coalesced: whole and atomic (through `write_atomic`: a temp file and
`os.replace`, so a reader never sees a half-written file) for an ordinary job, a snapshot
and a delta log for a big one. events.jsonl is append-only, one JSON object per line,
written per event so `srtr tui`/`tail -f` see each event at once.

Neither ever loses the job: a write that fails (full disk, read-only or vanished run dir)
leaves the file as it was, and the caller reports it (`write_faults`). events.jsonl keeps
the events it could not write in memory, in order, and appends them once it can.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import deque
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _str
from pathlib import Path
from typing import Any, cast

from srtr.resources.objects import InstanceSpec, NodeSpec, PoolSpec
from srtr.resources.render import mask
from srtr.store import causes
from srtr.store.rundir import (
    ConditionDoc,
    EventDoc,
    ExporterDoc,
    InstanceDoc,
    JobDoc,
    NodeDoc,
    PoolDoc,
    StateDoc,
)
from srtr.store.store import Condition, Event, InstanceStatus, Store
from srtr.store.write_faults import WriteFaults

Wall = Callable[[float | None], float | None]  # a store (monotonic) time → wall seconds
# Events kept in memory while events.jsonl cannot be written; beyond, they are counted.
MAX_PENDING_EVENTS = 10_000


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see either the old or the new file, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
        raise


def snapshot(
    store: Store, *, backend: str, controller_pid: int, slurm_job_id: str | None = None
) -> StateDoc:
    """The state.json document (docs/cli.md "The run dir"; the model is `rundir.StateDoc`)."""
    doc = head(store, backend=backend, controller_pid=controller_pid, slurm_job_id=slurm_job_id)
    wall = WallClock(store)
    doc["instances"] = [instance_record(store, name, wall) for name in store.specs]
    return doc


def head(
    store: Store, *, backend: str, controller_pid: int, slurm_job_id: str | None = None
) -> StateDoc:
    """state.json without its instances (`instances` is empty, in its place): the sections
    that cost O(nodes), which the state writer compares with what it last wrote."""
    desired = store.desired
    wall = WallClock(store)
    doc: StateDoc = {
        "job": job_doc(
            store,
            wall=wall,
            backend=backend,
            controller_pid=controller_pid,
            slurm_job_id=slurm_job_id,
        ),
        "nodes": _node_docs(desired.nodes.allocation),
        "pools": [pool_doc(store, p) for p in desired.pools],
        "instances": [],
        "recipe": store.recipe.to_json(),
        "carve": desired.nodes.to_json(),
        # Targets with their listing and scrape health, kept by the exporter controller.
        "exporters": [
            {"service": e.service, "node": e.node, "instance": e.instance, "url": e.url}
            for e in desired.exporters
        ],
    }
    if store.exporters is not None:  # with scrape health, once the controller started
        doc["exporters"] = exporter_rows(store)
    if store.grow.enabled:  # a section of its own, beside the modelled ones
        cast(dict[str, Any], doc)["grow"] = store.grow.to_json()
    return doc


_NODE_DOCS: list[tuple[tuple[NodeSpec, ...], list[NodeDoc]]] = []


def _node_docs(allocation: tuple[NodeSpec, ...]) -> list[NodeDoc]:
    """state.json's `nodes`: the same records for as long as the allocation is the same
    (every write of a big job built 10,000 and compared them with the last ones)."""
    if not _NODE_DOCS or _NODE_DOCS[0][0] is not allocation:
        docs: list[NodeDoc] = [{"name": n.name, "ip": n.ip, "state": n.role} for n in allocation]
        _NODE_DOCS[:] = [(allocation, docs)]
    return list(_NODE_DOCS[0][1])  # a list of its own: a caller may add to it


def instance_record(store: Store, name: str, wall: Wall | None = None) -> InstanceDoc:
    """Instance `name`'s record in state.json, as of now."""
    spec = store.specs[name]
    gate = store.gate_opened_at(spec.stage)
    return instance_doc(
        spec, store.status[name], wall=wall or WallClock(store), gate_started_at=gate
    )


def exporter_rows(store: Store) -> list[ExporterDoc]:
    """state.json's `exporters`: every desired target with its listing and scrape health."""
    state = store.exporters
    listed = state.listed_set if state is not None else frozenset()
    out: list[ExporterDoc] = []
    for exporter in store.desired.exporters:
        health = state.health.get(exporter) if state is not None else None
        out.append(
            {
                "service": exporter.service,
                "node": exporter.node,
                "instance": exporter.instance,
                "name": exporter.name,
                "url": exporter.url,
                "listed": exporter in listed,
                "up": health.up if health else None,
                "last_error": health.last_error if health else None,
                "last_scrape": health.last_scrape if health else None,
            }
        )
    return out


def pool_doc(store: Store, pool: PoolSpec) -> PoolDoc:
    """One pool: its nodes and readiness, what it waits for, and how it is autoscaled."""
    status = store.pools.get(pool.name)
    doc: PoolDoc = {
        "name": pool.name,
        "type": pool.type,
        "nodes": list(pool.nodes),
        "riders": list(pool.riders),
        "ready": status.ready if status else False,
        "pending": status.pending if status else None,
    }
    if status is not None and status.autoscale is not None:
        doc["autoscale"] = status.autoscale.to_json()
    gang = store.gangs.get(pool.name)
    if gang is not None:
        doc["restarts"] = gang.restarts
        doc["failed"] = gang.failed
        doc["first_failure"] = gang.first_failure
    return doc


class WallClock:
    """Monotonic store times as wall seconds (rounded to ms), which is what readers want."""

    def __init__(self, store: Store) -> None:
        self.offset = store.clock.wall() - store.clock.now()

    def __call__(self, t: float | None) -> float | None:
        return None if t is None else round(t + self.offset, 3)


def job_doc(
    store: Store,
    *,
    wall: Wall,
    backend: str,
    controller_pid: int,
    slurm_job_id: str | None,
) -> JobDoc:
    """state.json's `job`: the job's status and where its controller runs."""
    job = store.job
    doc: JobDoc = {
        "name": store.desired.job_name,
        "backend": backend,
        "phase": str(job.phase),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "generation": job.generation,
        "observed_generation": job.observed_generation,
        "controller_pid": controller_pid,
        "slurm_job_id": slurm_job_id,
        "stage": job.stage,
        "passed_stages": sorted(job.passed_stages),
        "started_at": wall(job.started_at),
        "end_time": job.end_time,
        "ended_at": wall(job.ended_at),
        "stages": [s.name for s in store.desired.stages],
        "conditions": [condition_doc(c) for c in job.conditions.values()],
        "write_faults": store.write_faults.to_json(),
        "cause": causes.cause_doc(job.cause),
    }
    if store.desired.dependencies:  # only then: the others' state.json reads as before
        doc["waiting"] = dict(job.waiting)
    return doc


def instance_doc(
    spec: InstanceSpec, st: InstanceStatus, *, wall: Wall, gate_started_at: float | None = None
) -> InstanceDoc:
    """One record of state.json's `instances`: the spec's placement and command, the status.

    `gate_started_at`: when the instance's stage began, while its stage gate is open.
    """
    stop_deadline = None
    if st.stop_sent_at is not None and st.alive and not st.kill_sent:
        stop_deadline = wall(st.stop_sent_at + spec.stop_grace_seconds)
    # When a probe that has not passed runs out of time (the probe controller's deadline):
    # the stage gate's, or after the gate the attempt's. The TUI counts it down.
    probe_deadline = None
    probing = spec.probe is not None and st.alive and not st.passed_readiness
    if probing and st.phase == "Starting" and spec.probe is not None:
        start = gate_started_at if gate_started_at is not None else st.started_at
        if start is not None:
            probe_deadline = wall(start + spec.probe.timeout_seconds)
    return {
        "name": spec.name,
        "service": spec.service,
        "kind": str(spec.kind),
        "pool": spec.pool,
        "index": spec.index,
        "node": spec.node,
        "node_ip": spec.node_ip,
        "phase": str(st.phase),
        "ready": st.ready,
        "restarts": st.restarts,
        "exit_code": st.exit_code,
        "pid": st.pid,
        "step": st.step,
        "log": spec.log,
        "shutdown_tier": spec.shutdown_tier,
        "critical": spec.critical,
        "terminal": spec.terminal,
        "command": list(spec.argv),
        "env": {k: mask(k, v) for k, v in spec.env},
        "probe": spec.probe.describe(spec.node_ip) if spec.probe else None,
        "probe_message": st.probe_message,
        "probe_deadline": probe_deadline,
        "probe_gate": probe_deadline is not None and gate_started_at is not None,
        "started_at": wall(st.started_at),
        "ready_at": wall(st.ready_at),
        "stop_grace_seconds": spec.stop_grace_seconds,
        "stop_deadline": stop_deadline,
        "next_start_at": wall(st.next_start_at) if st.phase == "BackOff" else None,
        "history": causes.kept_history(st.history),
        "attempt": st.attempt,
        "activated": st.activated,
        "identity": st.identity,
        "log_offset": st.log_offset,
        "conditions": [condition_doc(c) for c in st.conditions.values()],
        "liveness": spec.liveness.describe(spec.node_ip) if spec.liveness else None,
        "liveness_message": st.liveness_message,
    }


def condition_doc(condition: Condition) -> ConditionDoc:
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "last_transition": condition.last_transition,
    }


def event_doc(event: Event) -> EventDoc:
    """One line of events.jsonl."""
    return {
        "ts": event.ts,
        "type": str(event.type),
        "reason": event.reason,
        "object": event.object,
        "message": event.message,
        "generation": event.generation,
    }


class AppendFile:
    """An append-only file written whole records at a time, or not at all.

    A write that fails half-way (a full disk takes part of it, RLIMIT_FSIZE stops it at the
    limit) is cut back to where the file ended, so a reader never sees a torn line. A file
    that was deleted or replaced under us is reopened at its path, so nothing goes on being
    written into a file nobody can see; `restore` recreates a vanished directory first.
    """

    def __init__(self, path: Path, restore: Callable[[], bool] = lambda: False) -> None:
        self.path = path
        self._restore = restore
        self._fd: int | None = None
        self._id: tuple[int, int] | None = None

    def write(self, data: bytes) -> None:
        """Append `data`. Raises OSError, with the file as it was before."""
        fd = self._current()
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(0, "short write")
                view = view[written:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise

    def sync(self) -> None:
        """fsync what was appended (the lines are not synced one by one)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def _current(self) -> int:
        try:
            st = os.stat(self.path)
            found: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            found = None
        if self._fd is not None and found is not None and found == self._id:
            return self._fd
        self.close()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW  # no link
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            if not self._restore():
                raise
            fd = os.open(self.path, flags, 0o644)
        st = os.fstat(fd)
        self._fd, self._id = fd, (st.st_dev, st.st_ino)
        return fd

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = self._id = None


class EventLog:
    """Appends events to events.jsonl in order; never truncates what was written.

    Events that cannot be written wait in memory (at most `limit`; beyond, they are counted
    and the count becomes an `EventsDropped` event) and go out, in order, with the next event
    or the next `flush()` (the runtime retries on a timer while any wait).
    """

    TARGET = "events.jsonl"

    def __init__(self, path: Path, faults: WriteFaults, limit: int = MAX_PENDING_EVENTS) -> None:
        self.file = AppendFile(path, faults.restore_run_dir)
        self.faults = faults
        self.limit = limit
        self.pending: deque[Event] = deque()
        self.dropped = 0
        self._dropped_since = 0.0
        self._flushing = False
        self.failing = False  # the last write failed: what waits may not be written soon

    def __call__(self, event: Event) -> None:
        self.add(event)
        self.flush()

    def add(self, event: Event) -> None:
        """Queue `event` for the next `flush()` (the runtime's: once per loop turn, so a
        stage's 10,000 Launched events take a few writes, not 10,000). A turn that records
        more than `limit` (a teardown's batch of exits) writes them at once: only events
        that cannot be written are ever dropped."""
        if len(self.pending) >= self.limit and not self.failing:
            self.flush()
        if len(self.pending) < self.limit:
            self.pending.append(event)
        else:
            if not self.dropped:
                self._dropped_since = event.ts
            self.dropped += 1

    def flush(self) -> bool:
        """Write what waits (in one write); True when nothing waits any more."""
        if self._flushing:
            return False  # an event recorded while writing: the loop below takes it
        self._flushing = True
        try:
            while True:
                while self.pending:
                    count = len(self.pending)
                    data = b"".join(map(_event_line, self.pending))
                    try:
                        self.file.write(data)
                    except OSError as exc:
                        self.failing = True
                        self.faults.failed(self.TARGET, exc, _KEPT)
                        return False
                    self.failing = False
                    for _ in range(count):
                        self.pending.popleft()
                self._report_dropped()
                self.faults.ok(self.TARGET)  # may record (and so queue) one more event
                if not self.pending:
                    return True
        finally:
            self._flushing = False

    def _report_dropped(self) -> None:
        if self.dropped:
            count, self.dropped = self.dropped, 0
            self.faults.dropped_events(count, self._dropped_since, self.limit)

    def close(self) -> None:
        self.file.close()


def _event_line(event: Event) -> bytes:
    """`json.dumps(event_doc(event))` and a newline, byte for byte (readers may grep the
    spaced form), built from its six fields at a fraction of the encoder's cost."""
    text = _str
    return (
        f'{{"ts": {float(event.ts)!r}, "type": {text(str(event.type))}, '
        f'"reason": {text(event.reason)}, "object": {text(event.object)}, '
        f'"message": {text(event.message)}, "generation": {int(event.generation)}}}\n'
    ).encode()


_KEPT = "events are kept in memory and appended in order once it can be written"
