"""Controller tests (fake backend, fake clock) of `start: with_workers`' deferred probes and of
the setup steps' gate. The same behaviour on real processes: tests/e2e/local/test_setup_keys.py."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from srtr.controllers import manager
from srtr.controllers.context import JOB, instance_key, probe_key
from tests.support.controller_harness import Harness

WITH_WORKERS = """
name: t
roles:
  agg: {nodes: 2, command: [w]}
frontend: {type: generic, command: [fe]}
services:
  - name: master
    command: [m]
    start: with_workers
    readiness: {port: 8700, timeout_seconds: 50, interval_seconds: 1}
"""


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_with_workers_probe_waits_for_every_worker_launch(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(WITH_WORKERS, tmp_path)
        ctx = h.ctx
        await manager.process_one(ctx, JOB)  # the workers stage begins: all activated
        await manager.process_one(ctx, instance_key("service_master"))
        assert [s.name for s in h.backend.launches] == ["service_master"]
        await manager.process_one(ctx, probe_key("service_master"))
        await asyncio.gather(*list(ctx.tasks))
        assert h.prober.calls == []  # worker_agg_0 and _1 are not launched yet
        await manager.process_one(ctx, instance_key("worker_agg_0"))
        await manager.process_one(ctx, probe_key("service_master"))
        assert h.prober.calls == []
        await manager.process_one(ctx, instance_key("worker_agg_1"))  # the last launch
        await h.settle()
        assert h.prober.calls == ["service_master"]  # woken by the last worker's launch
        assert "frontend" not in {s.name for s in h.backend.launches}
        h.prober.ready.add("service_master")
        await h.advance(1)
        assert h.phase("service_master") == "Ready"
        assert "frontend" in {s.name for s in h.backend.launches}

    run(body())


def test_a_failing_with_workers_probe_fails_the_job_before_the_frontend(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(WITH_WORKERS, tmp_path)
        await h.settle()
        await h.advance(50)
        assert h.store.job.teardown_requested and h.store.job.exit_code == 1
        assert h.store.job.reason.startswith(
            "services[master] on node1 was not ready within 50s (tcp 127.0.0.2:8700, timeout=50s)"
        )
        assert "frontend" not in {s.name for s in h.backend.launches}

    run(body())


BUILD = """
name: t
services:
  - name: tool
    command: [tool]
    build_command: [make]
    build_timeout_seconds: 7
"""


def test_a_build_that_exits_non_zero_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(BUILD, tmp_path)
        await h.settle()
        h.exit("service_tool.build", 2)
        await h.settle()
        assert h.store.job.exit_code == 1
        assert h.store.job.reason == (
            "services[tool] build_command failed (exit 2); see logs/service_tool.build.out"
        )
        assert [s.name for s in h.backend.launches] == ["service_tool.build"]

    run(body())


def test_a_build_past_its_timeout_is_killed_and_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(BUILD, tmp_path)
        await h.settle()
        await h.advance(6.9)
        assert not h.store.job.teardown_requested and h.backend.signals == []
        await h.advance(0.1)
        assert h.backend.signals[0] == ("service_tool.build", signal.SIGKILL)
        assert h.store.job.reason == (
            "services[tool] build_command timed out after 7s and was killed; "
            "see logs/service_tool.build.out"
        )

    run(body())


def test_a_build_that_exits_zero_lets_the_service_start(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(BUILD, tmp_path)
        await h.settle()
        h.exit("service_tool.build", 0)
        await h.settle()
        assert h.phase("service_tool.build") == "Succeeded"
        assert [s.name for s in h.backend.launches] == ["service_tool.build", "service_tool"]
        await h.advance(100)  # a finished step's timeout no longer counts
        assert not h.store.job.teardown_requested

    run(body())
