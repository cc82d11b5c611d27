"""Launches in flight (`Capabilities.launches_in_flight`, the agent backend's): the controllers
begin launches one at a time in their order and await their answers together; nothing acts
on an instance whose launch is in flight. A fake backend holds each answer until told."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable
from pathlib import Path

from srtr.backends.base import Capabilities, LaunchSpec
from srtr.backends.fake import FakeBackend
from srtr.controllers import edits, instance, manager
from srtr.resources.diff import diff
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from tests.support.controller_harness import Harness


class HeldBackend(FakeBackend):
    """A fake whose launch waits for `answer(name)`, as a launch awaits an agent's reply."""

    def __init__(self, node_count: int, limit: int) -> None:
        super().__init__(node_count)
        self.capabilities = Capabilities(launches_in_flight=limit)
        self.asked: list[str] = []  # launches begun, in order
        self._answers: dict[str, asyncio.Event] = {}

    async def launch(self, spec: LaunchSpec) -> int:
        self.asked.append(spec.name)
        await self._answers.setdefault(spec.name, asyncio.Event()).wait()
        return await super().launch(spec)

    def answer(self, *names: str) -> None:
        for name in names:
            self._answers.setdefault(name, asyncio.Event()).set()


def held(recipe: str, tmp_path: Path, limit: int, nodes: int | None = None) -> Harness:
    h = Harness(recipe, tmp_path, nodes)
    h.backend = HeldBackend(len(h.backend.nodes()), limit)
    h.ctx.backend = h.backend
    h.backend.set_listener(lambda obs: instance.observe(h.ctx, obs))
    return h


async def worker(h: Harness) -> None:
    """The manager's worker, over the harness's queue (its timers run on the fake clock)."""
    while True:
        key = h.ctx.queue.get_nowait()
        if key is None:
            await asyncio.sleep(0)
            continue
        await manager.process_one(h.ctx, key)


async def until(what: Callable[[], object], why: str) -> None:
    """Let the worker and the launch tasks run until `what()` holds."""
    for _ in range(10_000):
        if what():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {why}")


async def idle() -> None:
    """Let everything runnable run (the worker polls: it never blocks on an empty queue)."""
    for _ in range(200):
        await asyncio.sleep(0)


def run(body: Callable[[], object]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


FOUR = """
name: t
services:
  - name: svc
    command: [sleep, inf]
    nodes: 4
"""


def test_launches_begin_in_order_and_overlap_up_to_the_limit(tmp_path: Path) -> None:
    async def body() -> None:
        h = held(FOUR, tmp_path, limit=2)
        names = [f"service_svc_node{k}" for k in range(1, 5)]
        task = asyncio.create_task(worker(h))
        await until(lambda: len(h.backend.asked) == 2, "two launches in flight")
        await idle()
        assert h.backend.asked == names[:2]  # the limit: the third waits for a slot
        assert h.ctx.launches.names == set(names[:2])
        assert all(h.phase(n) == "Pending" for n in names)
        h.backend.answer(names[1])  # answers come in any order
        await until(lambda: h.phase(names[1]) == "Running", "the second one launched")
        await until(lambda: len(h.backend.asked) == 3, "the slot taken by the next")
        assert h.backend.asked == names[:3] and h.phase(names[0]) == "Pending"
        h.backend.answer(*names)
        await until(lambda: all(h.phase(n) == "Running" for n in names), "every one running")
        assert h.backend.asked == names and not h.ctx.launches
        task.cancel()

    run(body)


TIERS = """
name: t
services:
  - name: late
    command: [sleep, inf]
    start: after_frontend
  - name: early
    command: [sleep, inf]
    start: before_workers
  - name: base
    command: [sleep, inf]
    start: infra
"""


def test_the_teardown_waits_for_a_launch_in_flight_then_stops_its_tier_first(
    tmp_path: Path,
) -> None:
    """Ending the job with a launch in flight would leave its process running; stopping the
    others first would stop its tier (the first) after theirs."""

    async def body() -> None:
        h = held(TIERS, tmp_path, limit=4)
        task = asyncio.create_task(worker(h))
        h.backend.answer("service_base", "service_early")
        await until(lambda: "service_late" in h.backend.asked, "the last stage's launch")
        manager.request_stop(h.ctx, signal.SIGINT)
        await idle()
        assert h.backend.signals == [] and not h.ctx.done.is_set()
        assert h.phase("service_late") == "Pending"  # in flight: not Stopped unlaunched
        h.backend.answer("service_late")
        await until(h.ctx.done.is_set, "the job's end")
        assert h.backend.signals == [
            ("service_late", signal.SIGTERM),
            ("service_early", signal.SIGTERM),
            ("service_base", signal.SIGTERM),
        ]
        assert h.backend.live == {}
        assert h.phase("service_late") == "Stopped"
        task.cancel()

    run(body)


def test_a_launch_in_flight_when_teardown_begins_is_the_last_one(tmp_path: Path) -> None:
    """A launch waiting for a slot when the teardown comes never begins."""

    async def body() -> None:
        h = held(FOUR, tmp_path, limit=1)
        task = asyncio.create_task(worker(h))
        await until(lambda: h.backend.asked == ["service_svc_node1"], "the first launch")
        manager.request_stop(h.ctx, signal.SIGTERM)
        h.backend.answer("service_svc_node1")
        await until(h.ctx.done.is_set, "the job's end")
        assert h.backend.asked == ["service_svc_node1"]
        assert h.backend.signals == [("service_svc_node1", signal.SIGTERM)]
        assert h.store.job.exit_code == 128 + signal.SIGTERM
        task.cancel()

    run(body)


TWO = """
name: t
services:
  - name: a
    command: [sleep, inf]
  - name: b
    command: [sleep, inf]
    nodes: 2
"""


def edit(h: Harness, text: str) -> list[list[str]]:
    """Apply `text` live; the names it restarts and removes."""
    _, new = plan_text_source(text, "recipe.yaml", local_allocation(2))
    plan = diff(h.store.desired, new)
    edits.apply(h.ctx, new, plan, text)
    return [[c.name for c in plan.restart], [c.name for c in plan.remove]]


async def b_in_flight(tmp_path: Path) -> tuple[Harness, list[str], asyncio.Task[None]]:
    """TWO with a launched and both of b's launches in flight; the worker's task."""
    h = held(TWO, tmp_path, limit=4)
    b = ["service_b_node1", "service_b_node2"]
    h.backend.answer("service_a")
    task = asyncio.create_task(worker(h))
    await until(lambda: len(h.backend.asked) == 3, "b's launches in flight")
    return h, b, task


def test_a_live_edit_restarts_a_launch_in_flight_with_its_new_spec(tmp_path: Path) -> None:
    async def body() -> None:
        h, b, task = await b_in_flight(tmp_path)
        assert edit(h, TWO.replace("[sleep, inf]\n    nodes", "[sleep, '100']\n    nodes")) == [
            b,
            [],
        ]
        h.backend.answer(*b)
        # The old command started; the edit's restart replaces it with the new one.
        await until(lambda: all(h.backend.launched(n) == 2 for n in b), "the restarts")
        await until(lambda: all(h.phase(n) == "Running" for n in b), "the new attempts")
        assert [s.argv for s in h.backend.launches if s.name == b[0]] == [
            ("sleep", "inf"),
            ("sleep", "100"),
        ]
        task.cancel()

    run(body)


def test_a_live_edit_forgets_a_launch_in_flight_only_once_it_is_stopped(tmp_path: Path) -> None:
    async def body() -> None:
        h, b, task = await b_in_flight(tmp_path)
        assert edit(h, TWO.split("  - name: b")[0]) == [[], b]
        await idle()
        assert all(n in h.store.specs for n in b)  # in flight: not forgotten yet
        h.backend.answer(*b)
        await until(lambda: not any(n in h.store.specs for n in b), "the removal")
        assert sorted(s for s in h.backend.signals if s[0] in b) == [(n, signal.SIGTERM) for n in b]
        assert h.backend.live.keys() == {"service_a"}
        task.cancel()

    run(body)


def test_a_backend_without_launches_in_flight_is_awaited_in_the_reconcile(
    tmp_path: Path,
) -> None:
    """The local backend's launch never waits: no task, no tracking, as before."""

    async def body() -> None:
        h = Harness(FOUR, tmp_path)
        assert dataclasses.replace(h.backend.capabilities).launches_in_flight == 0
        await h.settle()
        assert not h.ctx.tasks and not h.ctx.launches
        assert sorted(h.backend.live) == [f"service_svc_node{k}" for k in range(1, 5)]

    run(body)


def test_the_last_answer_in_flight_wakes_the_job(tmp_path: Path) -> None:
    """The job's reconcile looks at every instance: once per answer it was most of a large
    stage's launch; the last launch in flight wakes it, and it still moves on."""

    async def body() -> None:
        h = held(FOUR, tmp_path, limit=4)
        jobs: list[str] = []
        h.ctx.on_reconciled = lambda key, _s, _d: jobs.append(key) if key == "job" else None
        names = [f"service_svc_node{k}" for k in range(1, 5)]
        task = asyncio.create_task(worker(h))
        await until(lambda: len(h.backend.asked) == 4, "four launches in flight")
        await idle()
        before = len(jobs)
        h.backend.answer(*names[:3])
        await until(lambda: all(h.phase(n) == "Running" for n in names[:3]), "three launched")
        await idle()
        assert len(jobs) == before  # one still in flight: the job was not woken
        h.backend.answer(names[3])
        await until(lambda: len(jobs) > before, "the job woken by the last answer")
        await until(lambda: h.store.job.phase.value == "Running", "the job running")
        task.cancel()

    run(body)
