"""The real readiness prober: runs an instance's probe against its node, one attempt at a time.

Called by the probe controller through the `Prober` protocol. tcp/http go to the instance's
node IP; log probes read the instance's log incrementally from where this attempt began;
file probes resolve relative paths against the run's logs/ directory. The exporter controller
checks scrape health through it too (`scrape`), and the fleet controller counts a cluster's
live members (`fleet`), so controllers never import `probes` or `fleet`.

`ProbeRunner` is the part that needs no instance spec: the node agent runs probes on its node
with it (`backends/agent/node.py`), and `Prober` runs them here with it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from srtr.backends.probes import (
    LogProbe,
    ProbeResult,
    probe_exec,
    probe_file,
    probe_heartbeat,
    probe_http,
    probe_silence,
    probe_tcp,
)
from srtr.resources.objects import ExporterSpec, InstanceSpec, ProbeKind, ProbeSpec


class _Status(Protocol):
    attempt: int
    log_offset: int


class ProbeRunner:
    """One LogProbe per instance attempt, so each restart only scans its own output."""

    def __init__(self) -> None:
        self._logs: dict[str, tuple[int, LogProbe]] = {}
        # When a liveness `log` probe of (instance, attempt) first looked: silence before
        # that belongs to an earlier attempt.
        self._watched: dict[str, tuple[int, float]] = {}

    def forget(self, name: str) -> None:
        self._logs.pop(name, None)
        self._watched.pop(name, None)

    async def check(
        self,
        name: str,
        probe: ProbeSpec,
        *,
        node_ip: str,
        attempt: int,
        log_path: Path,
        log_offset: int,
        files_dir: Path,
        env: Mapping[str, str] | None = None,
        liveness: bool = False,
    ) -> tuple[bool, str]:
        """One attempt of `probe` for attempt `attempt` of instance `name`.

        `liveness`: the probe is a liveness probe, whose `timeout_seconds` bounds this
        attempt (a readiness probe's is the gate's deadline). `env`: an exec probe's."""
        timeout = probe.timeout_seconds if liveness else None
        if probe.kind is ProbeKind.TCP:
            assert probe.port is not None
            for port in (probe.port, *probe.more_ports):  # in turn: the first closed one says
                result = await probe_tcp(node_ip, port, timeout or min(1.0, probe.interval_seconds))
                if not result.ok:
                    break
        elif probe.kind is ProbeKind.HTTP:
            assert probe.port is not None and probe.path is not None
            result = await probe_http(
                node_ip,
                probe.port,
                probe.path,
                probe.status or 200,
                timeout or min(5.0, max(probe.interval_seconds, 1.0)),
            )
        elif probe.kind is ProbeKind.EXEC:
            result = await probe_exec(probe.command, env or {}, probe.timeout_seconds, files_dir)
        else:
            result = self._local(name, probe, attempt, log_path, log_offset, files_dir)
        return result.ok, result.message

    def _local(
        self,
        name: str,
        probe: ProbeSpec,
        attempt: int,
        log_path: Path,
        log_offset: int,
        files_dir: Path,
    ) -> ProbeResult:
        """The probes that only look at files: a log pattern, a log's silence, a file."""
        if probe.kind is ProbeKind.LOG:
            assert probe.pattern is not None
            held = self._logs.get(name)
            if held is None or held[0] != attempt:
                log_probe = LogProbe(log_path, re.compile(probe.pattern), offset=log_offset)
                held = (attempt, log_probe)
                self._logs[name] = held
            return held[1].check()
        now = time.time()  # file times are wall times
        if probe.kind is ProbeKind.SILENCE:
            assert probe.silence_seconds is not None
            seen = self._watched.get(name)
            if seen is None or seen[0] != attempt:
                seen = self._watched[name] = (attempt, now)
            return probe_silence(log_path, probe.silence_seconds, since=seen[1], now=now)
        assert probe.path is not None
        path = Path(probe.path)
        path = path if path.is_absolute() else files_dir / path
        if probe.max_age_seconds is not None:
            return probe_heartbeat(path, probe.max_age_seconds, now)
        return probe_file(path)


class Prober:
    """Runs the probes of instances here, on the controller's machine."""

    def __init__(self) -> None:
        self._runner = ProbeRunner()

    def forget(self, name: str) -> None:
        self._runner.forget(name)

    async def check(self, spec: InstanceSpec, status: _Status, run_dir: Path) -> tuple[bool, str]:
        assert spec.probe is not None
        return await self._runner.check(
            spec.name,
            spec.probe,
            node_ip=spec.node_ip,
            attempt=status.attempt,
            log_path=run_dir / spec.log,
            log_offset=status.log_offset,
            files_dir=run_dir / "logs",
        )

    async def liveness(
        self, spec: InstanceSpec, status: _Status, run_dir: Path
    ) -> tuple[bool, str]:
        """One attempt of the instance's liveness probe, here."""
        assert spec.liveness is not None
        return await self._runner.check(
            spec.name,
            spec.liveness,
            node_ip=spec.node_ip,
            attempt=status.attempt,
            log_path=run_dir / spec.log,
            log_offset=status.log_offset,
            files_dir=run_dir / "logs",
            env=probe_env(spec, run_dir),
            liveness=True,
        )

    def watch(
        self,
        spec: InstanceSpec,
        status: _Status,
        run_dir: Path,
        *,
        kind: str,
        delay: float,
        report: Callable[[bool, int, str], None],
    ) -> bool:
        return False  # the instance runs here: its controller probes it attempt by attempt

    async def scrape(self, exporter: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        return await http_scrape(exporter, timeout)

    async def fleet(self, url: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        # Here, not at the top: the node agent imports this module for ProbeRunner, and
        # urllib.request (http.client, email) is a fifth of what its start costs.
        from srtr.net.fleet import alive_members

        return await alive_members(url, timeout)

    async def published(self, where: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        """The count an autoscaled pool publishes (imported here for the same reason)."""
        from srtr.net.published import read_count

        return await read_count(where, timeout)


async def http_scrape(exporter: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
    """GET the exporter's URL; healthy when it answers 200 within `timeout` seconds."""
    url = urlsplit(exporter.url)
    path = url.path or "/"
    if url.query:
        path += f"?{url.query}"
    result = await probe_http(url.hostname or "", url.port or 80, path, 200, timeout)
    return result.ok, result.message


def probe_env(spec: InstanceSpec, run_dir: Path) -> dict[str, str]:
    """An exec probe runs in its instance's environment (what `instance._launch` gives it)."""
    if spec.liveness is None or spec.liveness.kind is not ProbeKind.EXEC:
        return {}
    return {**dict(spec.env), **dict(spec.export_env), "SRTR_RUN_DIR": str(run_dir.resolve())}
