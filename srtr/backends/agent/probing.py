"""`AgentProber`: the readiness and liveness probes of an agent's instances run on their
node, by its agent; those of instances on a step of their own, and exporters' scrapes, run here."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from srtr.backends.agent.watched import Report
from srtr.backends.prober import Prober
from srtr.resources.objects import ExporterSpec, InstanceSpec


class Status(Protocol):
    attempt: int
    log_offset: int


class ProbesByAgent(Protocol):
    """What runs a probe by an instance's agent (`AgentBackend`)."""

    def on_agent(self, name: str) -> bool: ...

    async def probe(
        self,
        spec: InstanceSpec,
        attempt: int,
        log_offset: int,
        run_dir: Path,
        *,
        liveness: bool = False,
    ) -> tuple[bool, str]: ...

    def watch(
        self,
        spec: InstanceSpec,
        kind: str,
        status: Status,
        run_dir: Path,
        delay: float,
        report: Report,
    ) -> bool: ...


class AgentProber:
    """Probes instances on their node through its agent; steps' instances, and exporters'
    scrapes, here (`prober.Prober`)."""

    def __init__(self, backend: ProbesByAgent) -> None:
        self._backend = backend
        self._here = Prober()

    def forget(self, name: str) -> None:
        self._here.forget(name)

    async def check(self, spec: InstanceSpec, status: Status, run_dir: Path) -> tuple[bool, str]:
        if not self._backend.on_agent(spec.name):
            return await self._here.check(spec, status, run_dir)
        return await self._backend.probe(spec, status.attempt, status.log_offset, run_dir)

    async def liveness(self, spec: InstanceSpec, status: Status, run_dir: Path) -> tuple[bool, str]:
        if not self._backend.on_agent(spec.name):
            return await self._here.liveness(spec, status, run_dir)
        return await self._backend.probe(
            spec, status.attempt, status.log_offset, run_dir, liveness=True
        )

    def watch(
        self,
        spec: InstanceSpec,
        status: Status,
        run_dir: Path,
        *,
        kind: str,
        delay: float,
        report: Report,
    ) -> bool:
        return self._backend.watch(spec, kind, status, run_dir, delay, report)

    async def scrape(self, exporter: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        return await self._here.scrape(exporter, timeout)

    async def fleet(self, url: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        # The head's dashboard answers on its node IP, like a scrape target: polled from here.
        return await self._here.fleet(url, timeout)

    async def published(self, where: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        return await self._here.published(where, timeout)
