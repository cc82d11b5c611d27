"""srtr's own Prometheus metrics, served by `srtr up --metrics-port [HOST:]PORT`.

What is exported:

    srtr_instances{phase}                      gauge: instances per phase (every phase, 0 too)
    srtr_restarts_total{service,node,reason}   counter: reason is failure, exit, probe, lost,
                                               user or edit
    srtr_probe_duration_seconds{probe}         histogram: one readiness attempt (tcp, http, …)
    srtr_reconcile_duration_seconds{controller} histogram: one reconcile (job, instance, …)
    srtr_queue_depth                           gauge: keys waiting in the work queue
    srtr_generation, srtr_observed_generation  gauges
    srtr_exporter_targets{state}               gauge: targets listed, up, down

Everything is updated on the event loop's thread; the HTTP server's thread only reads the
registry (prometheus-client locks each value). Counts over the store (phases, targets) are
recomputed at most once per `REFRESH_PERIOD` after a change, never per event, so a
4,096-instance launch costs a handful of recounts. Restarts are counted from the store's
events, probe latency by wrapping the prober, and reconcile time through the manager's
`Ctx.on_reconciled` hook, so controllers carry no metrics code and never import this module.

prometheus-client is imported only when metrics are switched on; with them off, the hook is
None and costs one comparison per reconcile.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.reconciler.clock import Clock, TimerHandle
from srtr.resources.objects import ExporterSpec, InstanceSpec
from srtr.store.store import Event, InstanceStatus, Phase, Store, UserAction

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from srtr.controllers.context import Ctx, Prober, Report
    from srtr.reconciler.workqueue import WorkQueue

REFRESH_PERIOD = 1.0
PROBE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RECONCILE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)
WILDCARDS = ("", "0.0.0.0", "::")


def parse_listen(text: str) -> tuple[str, int]:
    """`PORT` or `HOST:PORT` (`[::1]:PORT` for IPv6) → (host, port); argparse's `type=`.

    A bare port listens on every interface, like the exporters srtr runs: Prometheus usually
    scrapes from another machine than the one the job's controller is on.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host = "0.0.0.0"
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [HOST:]PORT with a port between 0 and 65535 (0 picks a free one)"
        )
    return host, int(port)


class TimedProber:
    """A `Prober` that records how long each readiness probe attempt took."""

    def __init__(self, inner: Prober, metrics: JobMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    async def check(
        self, spec: InstanceSpec, status: InstanceStatus, run_dir: Path
    ) -> tuple[bool, str]:
        started = time.perf_counter()
        try:
            return await self.inner.check(spec, status, run_dir)
        finally:
            kind = str(spec.probe.kind) if spec.probe else "none"
            self.metrics.probe_seconds.labels(kind).observe(time.perf_counter() - started)

    def forget(self, name: str) -> None:
        self.inner.forget(name)

    async def liveness(
        self, spec: InstanceSpec, status: InstanceStatus, run_dir: Path
    ) -> tuple[bool, str]:
        return await self.inner.liveness(spec, status, run_dir)

    def watch(
        self,
        spec: InstanceSpec,
        status: InstanceStatus,
        run_dir: Path,
        *,
        kind: str,
        delay: float,
        report: Report,
    ) -> bool:
        return self.inner.watch(spec, status, run_dir, kind=kind, delay=delay, report=report)

    async def scrape(self, exporter: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        return await self.inner.scrape(exporter, timeout)

    async def fleet(self, url: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        return await self.inner.fleet(url, timeout)

    async def published(self, where: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        return await self.inner.published(where, timeout)


class JobMetrics:
    """The metrics of one job, in a registry of their own (not prometheus-client's global)."""

    def __init__(self, store: Store, queue: WorkQueue[str], clock: Clock) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.store = store
        self.queue = queue
        self.clock = clock
        self.registry = CollectorRegistry()
        r = self.registry
        self.instances = Gauge("srtr_instances", "Instances by phase", ["phase"], registry=r)
        self.restarts = Counter(
            "srtr_restarts",
            "Instance restarts by service, node and reason",
            ["service", "node", "reason"],
            registry=r,
        )
        self.probe_seconds = Histogram(
            "srtr_probe_duration_seconds",
            "Duration of one readiness probe attempt",
            ["probe"],
            buckets=PROBE_BUCKETS,
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "srtr_reconcile_duration_seconds",
            "Duration of one reconcile, by controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("srtr_queue_depth", "Keys waiting in the work queue", registry=r)
        self.generation = Gauge("srtr_generation", "Generation of the desired state", registry=r)
        self.observed_generation = Gauge(
            "srtr_observed_generation", "Generation fully rolled out", registry=r
        )
        self.targets = Gauge(
            "srtr_exporter_targets", "Exporter targets by listing and health", ["state"], registry=r
        )
        self._reconcile_children: dict[str, Any] = {}
        self._timer: TimerHandle | None = None
        self._last_refresh: float | None = None
        self._causes: dict[str, str] = {}  # instance → why its next restart happens
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None
        store.subscribe_changes(self._on_change)
        store.subscribe_events(self._on_event)
        self.refresh()

    # -- updates on the loop's thread ----------------------------------------------------------
    def reconciled(self, key: str, seconds: float, depth: int) -> None:
        controller = key.partition("/")[0]
        child = self._reconcile_children.get(controller)
        if child is None:
            child = self._reconcile_children[controller] = self.reconcile_seconds.labels(controller)
        child.observe(seconds)
        self.queue_depth.set(depth)

    def _on_change(self) -> None:
        if self._timer is not None:
            return
        now = self.clock.now()
        last = self._last_refresh
        when = now if last is None else max(now, last + REFRESH_PERIOD)
        self._timer = self.clock.call_at(when, self._refresh_due)

    def _refresh_due(self) -> None:
        self._timer = None
        self.refresh()

    def refresh(self) -> None:
        """Recount phases, targets and generations from the store."""
        from srtr.controllers import exporter

        self._last_refresh = self.clock.now()
        counts = dict.fromkeys(Phase, 0)
        for status in self.store.status.values():
            counts[status.phase] += 1
        for phase, count in counts.items():
            self.instances.labels(str(phase)).set(count)
        job = self.store.job
        self.generation.set(job.generation)
        self.observed_generation.set(job.observed_generation)
        rows = exporter.rows(self.store)
        self.targets.labels("listed").set(sum(1 for r in rows if r["listed"]))
        self.targets.labels("up").set(sum(1 for r in rows if r["up"] is True))
        self.targets.labels("down").set(sum(1 for r in rows if r["up"] is False))
        self.queue_depth.set(len(self.queue))

    def _on_event(self, event: Event) -> None:
        kind, _, name = event.object.partition("/")
        if event.reason == "RecipeApplied":
            # An edit that changed an instance's config restarts it through user_action.
            for other, status in self.store.status.items():
                if status.user_action is UserAction.RESTART and self._causes.get(other) != "user":
                    self._causes[other] = "edit"
            return
        if kind != "instance":
            return
        reason = event.reason
        if reason == "ProbeFailed":
            self._causes[name] = "probe"
        elif reason == "NodeLost":
            self._causes[name] = "lost"
        elif reason == "RestartRequested":
            self._causes[name] = "user"
        elif reason == "Exited":
            if self._causes.get(name) not in ("user", "edit", "probe"):
                self._causes[name] = "failure" if event.type == "Warning" else "exit"
        elif reason == "Restarting":
            spec = self.store.specs.get(name)
            if spec is not None:
                cause = self._causes.pop(name, "exit")
                self.restarts.labels(spec.service, spec.node, cause).inc()

    def timed_prober(self, prober: Prober) -> TimedProber:
        return TimedProber(prober, self)

    def attach(self, ctx: Ctx) -> None:
        """Time the job's probes and reconciles (the prober wrapper and the manager's hook)."""
        ctx.prober = self.timed_prober(ctx.prober)
        ctx.on_reconciled = self.reconciled

    # -- serving -----------------------------------------------------------------------------
    def serve(self, host: str, port: int) -> str:
        """Start the HTTP endpoint (a daemon thread); return its /metrics URL."""
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        bound = self._server.server_port
        shown = socket.gethostname() if host in WILDCARDS else host
        if ":" in shown:
            shown = f"[{shown}]"
        self.url = f"http://{shown}:{bound}/metrics"
        return self.url

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._server is not None:
            # shutdown() waits for serve_forever's poll (≤0.5 s); the job is over by now.
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
