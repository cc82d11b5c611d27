"""Exporter controller: keep `prometheus/targets.json` equal to the Ready exporters; scrape them.

One key, `exporters`, stands for the whole targets file: the file is one Prometheus
`file_sd` document, so reconciling it per exporter would only rewrite it more often. The
reconcile is level-triggered: it recomputes which of `store.desired.exporters` belong to an
instance that is alive and Ready, writes the file (atomically) only when that set changed, and
schedules scrape-health checks. Probe, instance and edit controllers enqueue the key whenever
readiness, liveness or the desired state changes.

Scrape health is a plain HTTP GET of each listed target (`ctx.prober.scrape`, unless a test
sets `ExporterState.scrape`), run off the queue like a probe attempt, every `SCRAPE_INTERVAL`
seconds per target. Results go to state.json's `exporters` rows (see `rows`) and a flip to
failing (or back) is an event.

Kinds whose binary is missing at run time (a node without `prometheus-node-exporter`, any
machine without `dcgm-exporter`, or a GPU kind's program such as `mooncake_master` or the
`gpu_memory_service` Python module) are skipped here rather than failing to launch: `start`
(called by the runner before the loop) and `desired_changed` (called by a live edit) mark
their instances finished before the job controller can activate them. Doing it in the store
at the edges, rather than in `expand`, keeps `expand` pure (it must not look at PATH: a plan
is made on a laptop for a cluster) and keeps the instance controller free of special cases.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from srtr.controllers.context import Ctx
from srtr.reconciler.persist import write_atomic
from srtr.reconciler.store import Phase, Store
from srtr.reconciler.workqueue import Result
from srtr.resources.kinds import get_kind
from srtr.resources.objects import ExporterSpec, InstanceSpec

KEY = "exporters"
TARGETS_FILE = "prometheus/targets.json"
SCRAPE_INTERVAL = 15.0
SCRAPE_TIMEOUT = 2.0
# Exporter kinds have no readiness probe, so a target is listed the moment its process starts,
# before it listens. Failures within this grace of being listed are retried every
# `STARTUP_RETRY` seconds and are not reported; the target is simply not `up` yet.
STARTUP_GRACE = 10.0
STARTUP_RETRY = 0.5
# Bursts of Ready instances (a 4,096-node pool coming up) would otherwise rewrite and fsync a
# megabyte-sized file once per instance; at most one write per period is plenty for file_sd.
WRITE_PERIOD = 0.2
WRITE_RETRY = 1.0  # while the targets file cannot be written (a full disk)
# Scrapes of many targets fall due together after a large stage; a bound keeps the number of
# open sockets (and the loop's work per tick) small.
MAX_CONCURRENT_SCRAPES = 64

Scrape = Callable[[ExporterSpec, float], Awaitable[tuple[bool, str]]]
Which = Callable[[str], str | None]
HasModule = Callable[[str], bool]


def has_module(name: str) -> bool:
    """Whether this host's Python can import top-level package `name` (without importing it)."""
    return importlib.util.find_spec(name) is not None


@dataclass
class Health:
    """What the last scrape of one target said; `up` is None until scraped while listed."""

    up: bool | None = None
    last_error: str | None = None
    last_scrape: float | None = None  # wall clock, for readers
    next_at: float = 0.0  # monotonic; 0: scrape as soon as listed
    listed_at: float | None = None  # monotonic; None while not in the targets file
    in_flight: bool = False


@dataclass
class ExporterState:
    """Per-job bookkeeping of this controller, kept beside the store (see `state_of`)."""

    scrape: Scrape | None = None  # None: the prober's HTTP GET (`ctx.prober.scrape`)
    interval: float = SCRAPE_INTERVAL
    timeout: float = SCRAPE_TIMEOUT
    grace: float = STARTUP_GRACE
    retry: float = STARTUP_RETRY
    which: Which | None = None  # None: never skip (tests with a fake backend)
    module_found: HasModule = has_module
    # (binary|module, name) → present; each checked once
    found: dict[tuple[str, str], bool] = field(default_factory=dict)
    listed: tuple[ExporterSpec, ...] = ()
    listed_set: frozenset[ExporterSpec] = frozenset()
    written: str | None = None
    writes: int = 0
    last_write: float | None = None
    health: dict[ExporterSpec, Health] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    run_files: set[str] = field(default_factory=set)  # kind run files written (run-dir paths)
    limit: asyncio.Semaphore | None = None


def state_of(store: Store) -> ExporterState:
    """This controller's job-wide state (scrape results, what it last wrote), in the store."""
    state = store.extensions.get("exporter")
    if state is None:
        state = store.extensions["exporter"] = ExporterState()
        store.status_views["exporters"] = lambda: rows(store)
    assert isinstance(state, ExporterState)
    return state


# --- missing binaries -------------------------------------------------------------------------


def start(ctx: Ctx, which: Which | None = shutil.which) -> None:
    """Before the loop runs: remember how to look binaries up, and skip what cannot run.

    Also writes the (empty) targets file at once, so Prometheus can be pointed at it before
    anything is Ready.
    """
    state_of(ctx.store).which = which
    write_run_files(ctx)
    skip_missing(ctx)
    ctx.queue.add(KEY)


def desired_changed(ctx: Ctx) -> None:
    """A live edit replaced the desired state: skip new instances that cannot run, re-list."""
    write_run_files(ctx)
    skip_missing(ctx)
    ctx.queue.add(KEY)


def write_run_files(ctx: Ctx) -> None:
    """Write the config files the job's kinds name in their commands (the process exporter's
    group file) into the run dir, once each, before any instance of those kinds launches.

    A write that fails is a write fault (an event), not a crash: the exporter that needs the
    file then fails to start and says why in its log.
    """
    state = state_of(ctx.store)
    wanted: dict[str, str] = {}
    for spec in ctx.store.specs.values():
        kind = get_kind(spec.type)
        if kind is not None:
            wanted.update(kind.run_files)
    for path, text in wanted.items():
        if path in state.run_files:
            continue
        target = ctx.run_dir / path

        def write(target: Path = target, text: str = text) -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, text)

        if ctx.store.write_faults.attempt(path, write):
            state.run_files.add(path)


def _program(spec: InstanceSpec) -> tuple[str, str] | None:
    """What must exist for `spec` to run: ("binary", name on PATH) or ("module", package)."""
    kind = get_kind(spec.type)
    if kind is None or not spec.argv:
        return None
    # Only when the command still runs the kind's module: a recipe's own command may not.
    if kind.module is not None and any(kind.module in part for part in spec.argv):
        return ("module", kind.module.split(".")[0])
    if kind.binary is None:
        return None
    # The kind's binary where the argv names it (the donor runs it through a wrapper), else
    # argv[0]: a variant's program (`trtllm-serve`) or the path a recipe's `command` gives.
    return ("binary", kind.binary if kind.binary in spec.argv else spec.argv[0])


def _missing_text(program: tuple[str, str]) -> str:
    what, name = program
    if what == "module":
        return f"Python module '{name}' not found"
    return f"binary '{name}' not found on PATH"


def skip_missing(ctx: Ctx) -> None:
    """Mark never-started instances of kinds whose program is not on PATH as skipped.

    A skipped instance is Succeeded without ever launching (its Ready condition says why), so
    its stage passes and nothing restarts it; one warning per kind says how many were skipped.
    """
    store = ctx.store
    state = state_of(store)
    if state.which is None:
        return
    skipped: dict[tuple[str, tuple[str, str]], list[str]] = {}
    for name, spec in store.specs.items():
        program = _program(spec)
        if program is None or name in state.skipped:
            continue
        status = store.status[name]
        if status.attempt >= 0 or status.phase is not Phase.PENDING:
            continue
        found = state.found.get(program)
        if found is None:
            found = state.found[program] = (
                state.module_found(program[1])
                if program[0] == "module"
                else state.which(program[1]) is not None
            )
        if found:
            continue
        state.skipped.add(name)
        store.skipped(name, _missing_text(program))
        skipped.setdefault((spec.type, program), []).append(name)
    for (kind, program), names in skipped.items():
        known = get_kind(kind)
        # Exporters keep their own reason; other kinds (GPU programs) share one.
        exporter = known is not None and known.default_metrics_port is not None
        store.record(
            "job",
            "ExporterSkipped" if exporter else "ProgramMissing",
            f"{kind}: {_missing_text(program)}; skipping its {len(names)} instance(s)",
            warning=True,
        )


# --- the targets file ---------------------------------------------------------------------------


def _listed(store: Store) -> tuple[ExporterSpec, ...]:
    """Desired exporters whose instance is alive and Ready (and not on its way out)."""
    out = []
    for exporter in store.desired.exporters:
        status = store.status.get(exporter.instance)
        if (
            status is not None
            and status.alive
            and status.ready
            and status.phase in (Phase.READY, Phase.RUNNING)
            and exporter.instance not in store.removing
        ):
            out.append(exporter)
    return tuple(out)


def _pool_of_node(store: Store) -> dict[str, str]:
    return {node: pool for pool, nodes in store.desired.nodes.pools.items() for node in nodes}


def targets_document(store: Store, listed: tuple[ExporterSpec, ...]) -> list[dict[str, Any]]:
    """The file_sd document: one entry per target, labelled for grouping in queries.

    `pool` is the instance's pool, else the pool that owns its node (a node exporter placed
    on `compute` still says which pool it watches), else empty, which Prometheus drops.
    """
    pools = _pool_of_node(store)
    job = store.desired.job_name
    out = []
    for exporter in listed:
        spec = store.specs.get(exporter.instance)
        url = urlsplit(exporter.url)
        path = url.path or "/"
        if url.query:
            path += f"?{url.query}"
        pool = (spec.pool if spec is not None else None) or pools.get(exporter.node, "")
        out.append(
            {
                "targets": [url.netloc],
                "labels": {
                    "__metrics_path__": path,
                    "job": job,
                    "service": exporter.service,
                    "node": exporter.node,
                    "pool": pool,
                    "instance": exporter.instance,
                    "endpoint": exporter.name,
                },
            }
        )
    return out


def _write(ctx: Ctx, state: ExporterState, text: str) -> bool:
    """Write the targets file; False (a write fault, reported) when it cannot be written."""
    path = ctx.run_dir / TARGETS_FILE

    def write() -> None:
        path.parent.mkdir(exist_ok=True)  # a vanished run dir is recreated by the faults
        write_atomic(path, text)

    if not ctx.store.write_faults.attempt(TARGETS_FILE, write):
        return False
    state.written = text
    state.writes += 1
    state.last_write = ctx.clock.now()
    return True


def finish(ctx: Ctx) -> None:
    """After the job: list only what still runs (nothing, normally), so Prometheus lets go."""
    state = state_of(ctx.store)
    text = _text(ctx.store, _listed(ctx.store))
    if state.written is not None and text != state.written:
        _write(ctx, state, text)


def rewrite(ctx: Ctx) -> None:
    """The run dir was recreated: write the targets file again (if the job has one)."""
    state = state_of(ctx.store)
    state.run_files.clear()
    write_run_files(ctx)
    if state.written is not None:
        state.written = None
        ctx.queue.add(KEY)


def _text(store: Store, listed: tuple[ExporterSpec, ...]) -> str:
    return json.dumps(targets_document(store, listed), indent=1) + "\n"


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    state = state_of(store)
    now = ctx.clock.now()
    listed = _listed(store)
    wake: float | None = None
    if listed != state.listed or state.written is None:
        text = _text(store, listed)
        # No file for a job that never had an exporter; an empty list once it had some.
        if text != state.written and (store.desired.exporters or state.written is not None):
            due = (state.last_write or -WRITE_PERIOD) + WRITE_PERIOD
            if now < due:
                return Result(requeue_after=due - now)
            if not _write(ctx, state, text):
                return Result(requeue_after=WRITE_RETRY)  # the file lists what it listed
        state.listed, state.listed_set = listed, frozenset(listed)
        _forget_unlisted(ctx, state, listed)
    if store.job.teardown_requested:
        return None  # nothing new gets scraped while the job goes away
    for exporter in listed:
        health = state.health.setdefault(exporter, Health())
        if health.listed_at is None:
            health.listed_at = now
        if health.in_flight:
            continue
        if health.next_at <= now:
            health.in_flight = True
            health.next_at = now + state.interval
            ctx.spawn(_scrape(ctx, state, exporter, health))
        wake = health.next_at if wake is None else min(wake, health.next_at)
    return Result(requeue_after=max(wake - now, 0.0)) if wake is not None else None


def _forget_unlisted(ctx: Ctx, state: ExporterState, listed: tuple[ExporterSpec, ...]) -> None:
    """Targets that left the file are not scraped: their health goes back to unknown."""
    keep = state.listed_set
    desired = set(ctx.store.desired.exporters)
    changed = False
    for exporter in list(state.health):
        if exporter in keep:
            continue
        if exporter not in desired:
            del state.health[exporter]
        else:
            health = state.health[exporter]
            health.up, health.next_at, health.listed_at = None, 0.0, None
        changed = True
    if changed:
        ctx.store.changed()


async def _scrape(ctx: Ctx, state: ExporterState, exporter: ExporterSpec, health: Health) -> None:
    if state.limit is None:
        state.limit = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
    try:
        scrape = state.scrape if state.scrape is not None else ctx.prober.scrape
        async with state.limit:
            ok, message = await scrape(exporter, state.timeout)
    except Exception as exc:  # a scraper bug must not leave the target "in flight" forever
        ok, message = False, f"scrape error: {exc!r}"
    finally:
        health.in_flight = False
    store = ctx.store
    status = store.status.get(exporter.instance)
    if (
        state.health.get(exporter) is not health
        or exporter not in state.listed_set
        or status is None
        or not (status.alive and status.ready)
        or store.job.teardown_requested
    ):
        return  # it left (or is leaving) the targets file while we were asking
    now = ctx.clock.now()
    health.last_scrape = round(ctx.clock.wall(), 3)
    health.last_error = None if ok else message
    was = health.up
    if ok:
        health.up = True
        if was is False:
            store.record(
                f"instance/{exporter.instance}",
                "ScrapeOk",
                f"metrics endpoint {exporter.url} on {exporter.node} answers again",
            )
        else:
            store.changed()  # a first success says nothing new: the instance is Ready
        return
    listed_at = health.listed_at if health.listed_at is not None else now
    if was is None and now - listed_at < state.grace:
        health.next_at = min(health.next_at, now + state.retry)
        ctx.queue.add_after(KEY, health.next_at - now)
        store.changed()
        return
    health.up = False
    if was is False:
        store.changed()
        return
    store.record(
        f"instance/{exporter.instance}",
        "ScrapeFailed",
        f"metrics endpoint {exporter.url} on {exporter.node}: {message}",
        warning=True,
    )


# --- status -------------------------------------------------------------------------------------


def rows(store: Store) -> list[dict[str, Any]]:
    """state.json's `exporters`: every desired target with its listing and scrape health."""
    state = store.extensions.get("exporter")
    listed = state.listed_set if state is not None else frozenset()
    out = []
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
