"""Liveness, readiness after the gate and gang restarts, on a fake backend and a fake clock."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from srtr.controllers import edits, manager
from srtr.resources.diff import diff
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from srtr.store.store import EventType, JobPhase
from tests.support.controller_harness import Harness


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


LIVE = """
name: t
services:
  - name: web
    command: [serve]
    restart: {policy: on-failure, backoff_seconds: 1, max_restarts: 5}
    stop_grace_seconds: 4
    liveness:
      exec: {command: [check]}
      interval_seconds: 10
      failure_threshold: 3
"""


def test_liveness_failures_in_a_row_stop_and_restart_the_instance(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(LIVE, tmp_path)
        await h.settle()
        name = "service_web"
        assert h.phase(name) == "Running"
        assert h.prober.liveness_calls == [name]  # no readiness: watched from the launch
        h.prober.unhealthy.add(name)
        await h.advance(10)
        await h.advance(10)
        assert h.store.status[name].liveness_failures == 2
        assert h.backend.signals == []  # below the threshold: nothing happens
        h.backend.ignore_term.add(name)  # it sits out its grace: SIGKILL follows
        await h.advance(10)
        unhealthy = [e for e in h.events if e.reason == "Unhealthy"]
        assert len(unhealthy) == 1 and unhealthy[0].type is EventType.WARNING
        assert "scripted: no answer within 1s" in unhealthy[0].message
        assert h.backend.signals == [(name, signal.SIGTERM)]
        await h.advance(4)
        assert h.backend.signals == [(name, signal.SIGTERM), (name, signal.SIGKILL)]
        status = h.store.status[name]
        assert status.history[-1]["reason"] == "LivenessFailed"
        exited = [e for e in h.events if e.reason == "Exited"][-1]
        assert exited.type is EventType.WARNING and "LivenessFailed" in exited.message
        assert h.phase(name) == "BackOff"
        assert status.restarts == 0 and len(status.restart_times) == 0
        h.prober.unhealthy.clear()
        await h.advance(1)
        assert h.phase(name) == "Running"
        assert status.restarts == 1  # a liveness failure spends the crash budget
        assert status.liveness_failures == 0 and not status.liveness_failed

    run(body())


def test_a_liveness_failure_with_restart_never_fails_a_critical_job(tmp_path: Path) -> None:
    recipe = LIVE.replace(
        "restart: {policy: on-failure, backoff_seconds: 1, max_restarts: 5}",
        "restart: never\n    critical: true",
    )

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        h.prober.unhealthy.add("service_web")
        for _ in range(3):
            await h.advance(10)  # the fake backend ends it at SIGTERM, with 143
        assert h.phase("service_web") == "Failed"
        assert h.store.job.teardown_requested and h.store.job.exit_code == 1
        assert "critical instance service_web" in h.store.job.reason

    run(body())


READY_THEN_LIVE = """
name: t
services:
  - name: web
    command: [serve]
    readiness: {port: 8000, interval_seconds: 1, failure_threshold: 2}
    liveness: {port: 8000, interval_seconds: 5, initial_delay_seconds: 7}
"""


def test_liveness_counts_from_ready_and_after_its_initial_delay(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(READY_THEN_LIVE, tmp_path)
        await h.settle()
        name = "service_web"
        await h.advance(3)
        assert h.prober.liveness_calls == []  # not Ready: not watched
        h.prober.ready.add(name)
        await h.advance(1)
        assert h.phase(name) == "Ready"
        await h.advance(6)
        assert h.prober.liveness_calls == []
        await h.advance(1)  # 7 s after Ready
        assert h.prober.liveness_calls == [name]

    run(body())


def test_readiness_after_the_gate_makes_it_not_ready_and_ready_again(tmp_path: Path) -> None:
    recipe = READY_THEN_LIVE.replace(
        "    liveness: {port: 8000, interval_seconds: 5, initial_delay_seconds: 7}\n", ""
    )
    recipe = recipe.replace("    command: [serve]\n", "    command: [serve]\n    nodes: 2\n")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        a, b = "service_web_node1", "service_web_node2"
        h.prober.ready |= {a, b}
        await h.advance(1)
        assert h.store.pools["web"].ready
        h.prober.ready.discard(a)
        await h.advance(1)
        assert h.store.status[a].ready  # one failure: below the threshold
        await h.advance(1)
        status = h.store.status[a]
        assert not status.ready and h.phase(a) == "Running"
        assert not h.store.pools["web"].ready
        not_ready = [e for e in h.events if e.reason == "NotReady"]
        assert len(not_ready) == 1 and not_ready[0].object == f"instance/{a}"
        h.prober.ready.add(a)
        await h.advance(1)
        assert status.ready and h.phase(a) == "Ready"
        assert h.store.pools["web"].ready
        assert h.backend.signals == [] and h.backend.launched(a) == 1  # never restarted

    run(body())


GANG = """
name: t
services:
  - name: train
    command: [train]
    nodes: 3
    terminal: true
    stop_grace_seconds: 5
    restart: {policy: on-failure, scope: pool, max_restarts: 2, backoff_seconds: 2}
  - name: shipper
    command: [ship]
    placement: {pool: train}
"""
RANKS = ["service_train_node1", "service_train_node2", "service_train_node3"]


def test_one_failed_rank_restarts_the_whole_pool_in_pool_order(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GANG, tmp_path)
        await h.settle()
        assert all(h.phase(n) == "Running" for n in RANKS)
        h.backend.ignore_term.add(RANKS[2])
        h.exit(RANKS[1], 1)
        await h.settle()
        restarting = [e for e in h.events if e.reason == "PoolRestarting"]
        assert len(restarting) == 1
        assert RANKS[1] in restarting[0].message and "exited with code 1" in restarting[0].message
        assert "restart 1 of at most 2" in restarting[0].message
        assert (RANKS[0], signal.SIGTERM) in h.backend.signals
        assert h.backend.running() >= {RANKS[2], "service_shipper_node1"}  # riders stay
        await h.advance(5)  # rank 2 ignored SIGTERM: SIGKILL after its grace
        assert (RANKS[2], signal.SIGKILL) in h.backend.signals
        stopped = [
            e for e in h.events if e.reason == "Exited" and e.object != f"instance/{RANKS[1]}"
        ]
        assert stopped and all(e.type is EventType.NORMAL for e in stopped)  # srtr's stop
        assert all(h.phase(n) == "BackOff" for n in RANKS)
        h.backend.launches.clear()
        await h.advance(2)
        relaunched = [s for s in h.backend.launches if s.name in RANKS]
        assert [s.name for s in relaunched] == RANKS
        assert all(s.env["SRTR_RESTART_COUNT"] == "1" for s in relaunched)
        assert all(h.store.status[n].restarts == 1 for n in RANKS)
        assert not any(s.name.startswith("service_shipper") for s in h.backend.launches)
        for name in RANKS:
            h.exit(name, 0)
        await h.settle()
        assert h.store.job.teardown_requested and h.store.job.exit_code == 0

    run(body())


def test_a_rank_that_always_fails_ends_the_job_after_max_restarts(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GANG, tmp_path)
        await h.settle()
        for _ in range(2):
            h.exit(RANKS[0], 3)
            await h.settle()
            await h.advance(10)
            assert all(h.phase(n) == "Running" for n in RANKS)
        h.exit(RANKS[0], 3)
        await h.settle()
        assert [e.reason for e in h.events].count("PoolRestarting") == 2
        assert "PoolFailed" in h.reasons("pool/train")
        job = h.store.job
        assert job.teardown_requested and job.exit_code == 3
        assert "pool train failed" in job.reason and RANKS[0] in job.reason
        await h.settle()
        assert h.store.job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.TEARING_DOWN)
        assert h.phase(RANKS[0]) == "Failed"

    run(body())


def test_a_failed_launch_restarts_the_pool_and_restart_count_is_rendered(tmp_path: Path) -> None:
    recipe = GANG.replace("command: [train]", 'command: [train, "--resume={restart_count}"]')

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        assert [s.argv for s in h.backend.launches if s.name == RANKS[0]] == [
            ("train", "--resume=0")
        ]
        h.exit(RANKS[0], 0)  # rank 0 finished first: no failure
        await h.settle()
        assert h.phase(RANKS[0]) == "Succeeded"
        h.backend.fail_launch.add(RANKS[1])
        h.exit(RANKS[1], 1)
        await h.settle()
        await h.advance(2)  # the backoff; rank 1's relaunch fails: a second pool restart
        restarting = [e for e in h.events if e.reason == "PoolRestarting"]
        assert len(restarting) == 2 and "could not be launched" in restarting[1].message
        h.backend.fail_launch.clear()
        await h.advance(10)
        assert all(h.phase(n) == "Running" for n in RANKS)  # the finished rank 0 too
        assert [s.argv for s in h.backend.launches if s.name == RANKS[0]][-1] == (
            "train",
            "--resume=2",
        )

    run(body())


def test_probes_its_node_watches_report_transitions_only(tmp_path: Path) -> None:
    recipe = READY_THEN_LIVE.replace("initial_delay_seconds: 7", "initial_delay_seconds: 0")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        h.prober.on_node = True
        await h.settle()
        name = "service_web"
        h.prober.ready.add(name)
        await h.advance(1)  # the gate's probe runs here, attempt by attempt
        assert h.phase(name) == "Ready"
        assert set(h.prober.watched) == {(name, "readiness"), (name, "liveness")}
        calls = len(h.prober.calls)
        await h.advance(30)
        assert len(h.prober.calls) == calls and h.prober.liveness_calls == []  # the node's
        h.prober.watched[(name, "readiness")](False, 2, "connection refused")
        await h.settle()
        assert not h.store.status[name].ready and "NotReady" in h.reasons()
        h.prober.watched[(name, "readiness")](True, 0, "connected")
        await h.settle()
        assert h.store.status[name].ready
        h.prober.watched[(name, "liveness")](False, 3, "tcp 127.0.0.2:8000: connection refused")
        await h.settle()
        assert "Unhealthy" in h.reasons() and (name, signal.SIGTERM) in h.backend.signals
        assert h.store.status[name].history[-1]["reason"] == "LivenessFailed"

    run(body())


def test_a_lost_member_restarts_the_rest_of_its_pool(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GANG, tmp_path)
        await h.settle()
        h.backend.lose(RANKS[2])
        await h.settle()
        restarting = [e for e in h.events if e.reason == "PoolRestarting"]
        assert len(restarting) == 1 and "was lost with its node node3" in restarting[0].message
        assert h.phase(RANKS[2]) == "Lost"
        h.backend.launches.clear()
        await h.advance(2)
        assert [s.name for s in h.backend.launches if s.name in RANKS] == RANKS[:2]
        assert all(s.env["SRTR_RESTART_COUNT"] == "1" for s in h.backend.launches)

    run(body())


def test_members_held_for_a_pool_restart_end_stopped_with_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GANG, tmp_path)
        await h.settle()
        h.exit(RANKS[0], 1)
        await h.settle()
        assert all(h.phase(n) == "BackOff" for n in RANKS)  # the pool's backoff
        manager.request_stop(h.ctx, signal.SIGINT)
        await h.settle()
        assert all(h.phase(n) == "Stopped" for n in RANKS)
        assert h.ctx.done.is_set()

    run(body())


def test_a_liveness_probe_added_by_a_live_edit_starts_watching(tmp_path: Path) -> None:
    plain = "name: t\nservices:\n  - name: web\n    command: [serve]\n"
    edited = plain + "    liveness: {exec: {command: [check]}, interval_seconds: 5}\n"

    async def body() -> None:
        h = Harness(plain, tmp_path)
        await h.settle()
        _, new = plan_text_source(edited, "recipe.yaml", local_allocation(1))
        plan = diff(h.store.desired, new, launched=frozenset({"service_web"}))
        assert not plan.restart and [c.name for c in plan.hot] == ["service_web"]
        edits.apply(h.ctx, new, plan, edited)
        await h.settle()
        assert h.prober.liveness_calls == ["service_web"]
        await h.advance(5)
        assert h.prober.liveness_calls == ["service_web"] * 2

    run(body())
