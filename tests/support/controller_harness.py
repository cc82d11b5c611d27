"""Store + FakeBackend + FakeClock + FakeProber: drive controllers with no real waiting."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from srtr.backends.fake import FakeBackend
from srtr.backends.prober import http_scrape
from srtr.controllers import instance, manager
from srtr.controllers.context import JOB, Ctx, Report
from srtr.reconciler.clock import FakeClock
from srtr.reconciler.workqueue import WorkQueue
from srtr.resources.effective import allocation_size
from srtr.resources.expand import local_allocation
from srtr.resources.loading import load_text
from srtr.resources.objects import ExporterSpec, InstanceSpec
from srtr.resources.planning import plan_text_source
from srtr.store.store import Event, InstanceStatus, Store


class FakeProber:
    def __init__(self) -> None:
        self.ready: set[str] = set()
        self.calls: list[str] = []
        # Liveness: instances whose liveness probe fails (every other one passes).
        self.unhealthy: set[str] = set()
        self.liveness_calls: list[str] = []
        # As a node agent's prober: `watch` takes the probe loops, kept here by (name, kind)
        # with the report callback a test calls to play a transition.
        self.on_node = False
        self.watched: dict[tuple[str, str], Report] = {}
        # Scripted fleet answers, one per poll (the last one repeats): live members or None.
        self.fleet_answers: list[int | None] = [None]
        self.fleet_polls = 0
        # Scripted published counts of autoscaled pools, by URL (or path); reads made.
        self.published_answers: dict[str, int] = {}
        self.published_reads: list[str] = []

    async def check(
        self, spec: InstanceSpec, status: InstanceStatus, run_dir: Path
    ) -> tuple[bool, str]:
        self.calls.append(spec.name)
        return spec.name in self.ready, "connection refused"

    def forget(self, name: str) -> None:
        pass

    async def liveness(
        self, spec: InstanceSpec, status: InstanceStatus, run_dir: Path
    ) -> tuple[bool, str]:
        self.liveness_calls.append(spec.name)
        return spec.name not in self.unhealthy, "scripted: no answer within 1s"

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
        if self.on_node:
            self.watched[(spec.name, kind)] = report
        return self.on_node

    async def scrape(self, exporter: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        # The real GET, as before scrapes went through the prober; exporter tests that want
        # scripted answers set `exporter.state_of(store).scrape` instead.
        return await http_scrape(exporter, timeout)

    async def fleet(self, url: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        answer = self.fleet_answers[min(self.fleet_polls, len(self.fleet_answers) - 1)]
        self.fleet_polls += 1
        return answer, f"{url}: scripted {answer}"

    async def published(self, where: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        answer = self.published_answers.get(where)
        self.published_reads.append(where)
        if answer is None:
            return None, f"{where}: nothing published"
        return answer, f"{where}: {answer}"


def one_service_store() -> Store:
    """The store of a one-service job on one node, on a fake clock (no harness around it)."""
    recipe = "name: t\nservices:\n  - name: s\n    command: [sleep, inf]\n"
    _, desired = plan_text_source(recipe, "recipe.yaml", local_allocation(1))
    return Store(desired, FakeClock())


class Harness:
    def __init__(self, recipe: str, tmp_path: Path, nodes: int | None = None) -> None:
        text = textwrap.dedent(recipe)
        count = nodes or allocation_size(load_text(text))
        _, desired = plan_text_source(text, "recipe.yaml", local_allocation(count))
        self.clock = FakeClock()
        self.store = Store(desired, self.clock)
        self.backend = FakeBackend(count)
        self.prober = FakeProber()
        self.events: list[Event] = []
        self.store.subscribe_events(self.events.append)
        self.ctx = Ctx(
            store=self.store,
            backend=self.backend,
            clock=self.clock,
            queue=WorkQueue(self.clock),
            prober=self.prober,
            run_dir=tmp_path,
            jitter=lambda: 1.0,
        )
        self.backend.set_listener(lambda obs: instance.observe(self.ctx, obs))
        self.ctx.queue.add(JOB)

    async def settle(self) -> None:
        """Process every key that is due now, including probe tasks, until nothing moves."""
        for _ in range(100_000):
            key = self.ctx.queue.get_nowait()
            if key is None:
                if not self.ctx.tasks:
                    return
                await asyncio.gather(*list(self.ctx.tasks))
                continue
            await manager.process_one(self.ctx, key)
        raise AssertionError("the controllers did not settle")

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.settle()

    def phase(self, name: str) -> str:
        return str(self.store.status[name].phase)

    def reasons(self, obj: str | None = None) -> list[str]:
        return [e.reason for e in self.events if obj is None or e.object == obj]

    def exit(self, name: str, code: int) -> None:
        self.backend.exit(name, code)
