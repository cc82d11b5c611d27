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
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from srtr.backends.probes import LogProbe, probe_file, probe_http, probe_tcp
from srtr.resources.objects import ExporterSpec, InstanceSpec, ProbeKind, ProbeSpec


class _Status(Protocol):
    attempt: int
    log_offset: int


class ProbeRunner:
    """One LogProbe per instance attempt, so each restart only scans its own output."""

    def __init__(self) -> None:
        self._logs: dict[str, tuple[int, LogProbe]] = {}

    def forget(self, name: str) -> None:
        self._logs.pop(name, None)

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
    ) -> tuple[bool, str]:
        """One attempt of `probe` for attempt `attempt` of instance `name`."""
        if probe.kind is ProbeKind.TCP:
            assert probe.port is not None
            for port in (probe.port, *probe.more_ports):  # in turn: the first closed one says
                result = await probe_tcp(node_ip, port, min(1.0, probe.interval_seconds))
                if not result.ok:
                    break
        elif probe.kind is ProbeKind.HTTP:
            assert probe.port is not None and probe.path is not None
            result = await probe_http(
                node_ip,
                probe.port,
                probe.path,
                probe.status or 200,
                min(5.0, max(probe.interval_seconds, 1.0)),
            )
        elif probe.kind is ProbeKind.LOG:
            assert probe.pattern is not None
            held = self._logs.get(name)
            if held is None or held[0] != attempt:
                log_probe = LogProbe(log_path, re.compile(probe.pattern), offset=log_offset)
                held = (attempt, log_probe)
                self._logs[name] = held
            result = held[1].check()
        else:
            assert probe.path is not None
            path = Path(probe.path)
            result = probe_file(path if path.is_absolute() else files_dir / path)
        return result.ok, result.message


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
