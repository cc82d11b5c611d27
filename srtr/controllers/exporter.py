"""Exporter controller: keep `prometheus/targets.json` equal to the Ready exporters; scrape them.

One key, `exporters`, stands for the whole targets file: the file is one Prometheus
`file_sd` document, so reconciling it per exporter would only rewrite it more often. The
reconcile is level-triggered: it recomputes which of `store.desired.exporters` belong to an
instance that is alive and Ready, puts the file's new text in the store (`ExporterStatus.text`;
the targets-file side task in `runtime/` writes it) only when that set changed, and
schedules scrape-health checks. Probe, instance and edit controllers enqueue the key whenever
readiness, liveness or the desired state changes.

Scrape health is a plain HTTP GET of each listed target (`ctx.prober.scrape`, unless a test
sets `ExporterStatus.scrape`), run off the queue like a probe attempt, every `SCRAPE_INTERVAL`
seconds per target. Results go to state.json's `exporters` rows (see `rows`) and a flip to
failing (or back) is an event.

Kinds whose program the backend lacks at run time (`Backend.has_program`: a node without
`prometheus-node-exporter`, any machine without `dcgm-exporter`, or a GPU kind's program such
as `mooncake_master` or the `gpu_memory_service` Python module) are skipped here rather than
failing to launch: `start` (called by the runner before the loop) and `desired_changed`
(called by a live edit) mark their instances finished before the job controller can activate
them. Doing it in the store at the edges, rather than in `expand`, keeps `expand` pure (it
must not look at PATH: a plan is made on a laptop for a cluster) and keeps the instance
controller free of special cases.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

from srtr.controllers.context import Ctx
from srtr.reconciler.workqueue import Result
from srtr.resources.kinds import get_kind
from srtr.resources.objects import ExporterSpec, InstanceSpec
from srtr.store.persist import exporter_rows
from srtr.store.status_parts import ExporterStatus, Health
from srtr.store.store import Phase, Store

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
# Scrapes of many targets fall due together after a large stage; a bound keeps the number of
# open sockets (and the loop's work per tick) small.
MAX_CONCURRENT_SCRAPES = 64


def state_of(store: Store) -> ExporterStatus:
    """This controller's job-wide state (scrape results, what the file lists), in the store."""
    if store.exporters is None:
        store.exporters = ExporterStatus(
            interval=SCRAPE_INTERVAL,
            timeout=SCRAPE_TIMEOUT,
            grace=STARTUP_GRACE,
            retry=STARTUP_RETRY,
        )
    return store.exporters


# --- missing binaries -------------------------------------------------------------------------


def start(ctx: Ctx) -> None:
    """Before the loop runs: skip what cannot run, and list the targets (the first reconcile
    makes the (empty) targets file, so Prometheus can be pointed at it before anything is
    Ready)."""
    state_of(ctx.store)
    skip_missing(ctx)
    ctx.queue.add(KEY)


def desired_changed(ctx: Ctx) -> None:
    """A live edit replaced the desired state: skip new instances that cannot run, re-list."""
    skip_missing(ctx)
    ctx.queue.add(KEY)


def run_files(store: Store) -> dict[str, str]:
    """The config files the job's kinds name in their commands (the process exporter's
    group file), by run-dir path: the targets-file writer writes them before any instance
    of those kinds launches."""
    wanted: dict[str, str] = {}
    for spec in store.specs.values():
        kind = get_kind(spec.type)
        if kind is not None:
            wanted.update(kind.run_files)
    return wanted


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
    """Mark never-started instances of kinds whose program the backend lacks as skipped.

    A skipped instance is Succeeded without ever launching (its Ready condition says why), so
    its stage passes and nothing restarts it; one warning per kind says how many were skipped.
    """
    store = ctx.store
    state = state_of(store)
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
            found = state.found[program] = ctx.backend.has_program(*program)
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


def listed(store: Store) -> tuple[ExporterSpec, ...]:
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


def targets_text(store: Store, listed: tuple[ExporterSpec, ...]) -> str:
    """The targets file's text for `listed`."""
    return json.dumps(targets_document(store, listed), indent=1) + "\n"


async def reconcile(ctx: Ctx) -> Result | None:
    store = ctx.store
    state = state_of(store)
    now = ctx.clock.now()
    now_listed = listed(store)
    wake: float | None = None
    if now_listed != state.listed or state.text is None:
        text = targets_text(store, now_listed)
        # No file for a job that never had an exporter; an empty list once it had some.
        if text != state.text and (store.desired.exporters or state.text is not None):
            due = (state.last_write or -WRITE_PERIOD) + WRITE_PERIOD
            if now < due:
                return Result(requeue_after=due - now)
            state.text, state.last_write = text, now  # the targets-file writer writes it
            store.changed()
        state.listed, state.listed_set = now_listed, frozenset(now_listed)
        _forget_unlisted(ctx, state, now_listed)
    if store.job.teardown_requested:
        return None  # nothing new gets scraped while the job goes away
    for exporter in now_listed:
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


def _forget_unlisted(ctx: Ctx, state: ExporterStatus, listed: tuple[ExporterSpec, ...]) -> None:
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


async def _scrape(ctx: Ctx, state: ExporterStatus, exporter: ExporterSpec, health: Health) -> None:
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
    return [dict(row) for row in exporter_rows(store)]
