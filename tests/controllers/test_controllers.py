"""Controller behaviour on a fake backend and a fake clock: no processes, no real sleeping."""

from __future__ import annotations

import asyncio
import itertools
import signal
from pathlib import Path

from srtr.backends.base import LaunchSpec
from tests.support.controller_harness import Harness

RIDER = """
name: t
services:
  - name: owner
    command: [sleep, inf]
    nodes: 1
  - name: rider
    command: [sleep, inf]
    placement: {pool: owner}
    restart: {backoff_seconds: 1, max_backoff_seconds: 8, max_restarts: 10,
              window_seconds: 1000, reset_after_seconds: 100}
"""


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_rider_backoff_doubles_to_the_cap(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        await h.settle()
        assert h.phase("service_rider") == "Running"
        delays = []
        for _ in range(5):
            h.exit("service_rider", 1)
            await h.settle()
            status = h.store.status["service_rider"]
            assert h.phase("service_rider") == "BackOff"
            assert status.next_start_at is not None
            delays.append(round(status.next_start_at - h.clock.now(), 6))
            await h.advance(delays[-1])
            assert h.phase("service_rider") == "Running"
        assert delays == [1, 2, 4, 8, 8]
        assert h.store.status["service_rider"].restarts == 5
        assert h.backend.launched("service_rider") == 6

    run(body())


def test_backoff_resets_after_a_stable_run(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        await h.settle()
        for _ in range(3):
            h.exit("service_rider", 1)
            await h.settle()
            await h.advance(h.store.status["service_rider"].next_start_at - h.clock.now())
        await h.advance(100)  # reset_after_seconds of stable running
        h.exit("service_rider", 1)
        await h.settle()
        status = h.store.status["service_rider"]
        assert status.next_start_at - h.clock.now() == 1

    run(body())


def test_restart_budget_gives_up(tmp_path: Path) -> None:
    recipe = RIDER.replace("max_restarts: 10", "max_restarts: 2")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        for _ in range(2):
            h.exit("service_rider", 1)
            await h.settle()
            await h.advance(10)
        h.exit("service_rider", 1)
        await h.settle()
        assert h.phase("service_rider") == "Failed"
        assert "GaveUp" in h.reasons("instance/service_rider")
        await h.advance(100)
        assert h.backend.launched("service_rider") == 3
        assert not h.store.job.teardown_requested  # a non-critical rider does not end the job

    run(body())


def test_clean_exit_of_on_failure_rider_is_not_restarted(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        await h.settle()
        h.exit("service_rider", 0)
        await h.settle()
        assert h.phase("service_rider") == "Succeeded"
        await h.advance(60)
        assert h.backend.launched("service_rider") == 1

    run(body())


TIERS = """
name: t
services:
  - name: late
    command: [sleep, inf]
    start: after_frontend
  - name: early
    command: [sleep, inf]
    start: before_workers
    stop_grace_seconds: 5
  - name: base
    command: [sleep, inf]
    start: infra
"""


def test_teardown_goes_tier_by_tier_and_escalates_after_grace(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(TIERS, tmp_path)
        await h.settle()
        assert sorted(h.backend.live) == ["service_base", "service_early", "service_late"]
        h.backend.ignore_term.add("service_early")
        from srtr.controllers.manager import request_stop

        request_stop(h.ctx, signal.SIGINT)
        await h.settle()
        # tier 0 stops at once, then tier 1 gets SIGTERM and ignores it; tier 2 must wait
        assert h.backend.signals == [
            ("service_late", signal.SIGTERM),
            ("service_early", signal.SIGTERM),
        ]
        assert h.phase("service_late") == "Stopped"
        await h.advance(4.9)
        assert "service_early" in h.backend.live
        await h.advance(0.1)
        assert ("service_early", signal.SIGKILL) in h.backend.signals
        assert ("service_base", signal.SIGTERM) in h.backend.signals
        assert h.store.job.phase == "Failed"
        assert h.store.job.exit_code == 130
        assert h.ctx.done.is_set()
        assert "Killed" in h.reasons("instance/service_early")

    run(body())


TERMINAL = """
name: t
services:
  - name: train
    command: [run]
    nodes: 2
    terminal: true
  - name: side
    command: [sleep, inf]
    placement: {pool: train}
"""


def test_terminal_services_end_the_job_with_the_first_failures_code(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(TERMINAL, tmp_path)
        await h.settle()
        h.exit("service_train_node1", 0)
        await h.settle()
        assert not h.store.job.teardown_requested
        h.exit("service_train_node2", 3)
        await h.settle()
        assert h.store.job.exit_code == 3
        assert h.store.job.phase == "Failed"
        assert h.phase("service_side_node1") == "Stopped"
        assert h.store.job.reason.startswith(
            "terminal service(s) failed (first failed: service_train_node2 on node2, exit code 3"
        )
        assert "first failure" not in h.store.job.reason  # it names that instance already
        cause = h.store.job.cause
        assert cause is not None and cause.instance == "service_train_node2"
        assert (cause.exit_code, cause.reason) == (3, "Error")

    run(body())


CRITICAL = """
name: t
services:
  - name: db
    command: [db]
    critical: true
  - name: app
    command: [app]
"""


def test_critical_failure_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(CRITICAL, tmp_path)
        await h.settle()
        h.exit("service_db", 3)
        await h.settle()
        assert h.store.job.exit_code == 1
        assert h.store.job.phase == "Failed"
        assert "critical instance service_db" in h.store.job.reason
        assert h.phase("service_app") == "Stopped"
        assert "JobFailed" in h.reasons("job")

    run(body())


PROBED = """
name: t
services:
  - name: db
    command: [db]
    critical: true
    start: before_workers
    readiness: {port: 9000, timeout_seconds: 5, interval_seconds: 1}
  - name: app
    command: [app]
"""


def test_next_stage_waits_for_readiness(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(PROBED, tmp_path)
        await h.settle()
        assert h.phase("service_db") == "Starting"
        assert h.backend.launched("service_app") == 0
        await h.advance(1)
        assert h.backend.launched("service_app") == 0
        h.prober.ready.add("service_db")
        await h.advance(1)
        assert h.phase("service_db") == "Ready"
        assert h.backend.launched("service_app") == 1

    run(body())


def test_probe_timeout_of_a_critical_instance_fails_the_job(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(PROBED, tmp_path)
        await h.settle()
        for _ in range(5):
            await h.advance(1)
        assert h.store.job.exit_code == 1
        # srtctl's words, its describe() included (reference S-61)
        assert h.store.job.reason == (
            "services[db] on node1 was not ready within 5s (tcp 127.0.0.2:9000, timeout=5s); "
            "see logs/service_db.out"
        )
        assert h.backend.launched("service_app") == 0
        assert len(h.prober.calls) >= 5

    run(body())


def test_exit_before_probe_passes_falls_to_restart_policy(tmp_path: Path) -> None:
    recipe = PROBED.replace("critical: true", "restart: {policy: on-failure, backoff_seconds: 2}")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        h.exit("service_db", 1)
        await h.settle()
        assert h.phase("service_db") == "BackOff"
        await h.advance(2)
        assert h.phase("service_db") == "Starting"
        assert h.backend.launched("service_db") == 2

    run(body())


# --- the stage gate fails the job, as srtctl's does (reference S-61) -----------------------------

GATE = """
name: t
services:
  - name: x
    command: [x]
    nodes: 3
    start: before_workers
    readiness: {port: 9000, timeout_seconds: 5, interval_seconds: 1}
  - name: app
    command: [app]
"""
X = ("service_x_node1", "service_x_node2", "service_x_node3")
EXITED_127 = (
    "services[x] exited with code 127 on node3 before its readiness probe passed "
    "(tcp 127.0.0.4:9000, timeout=5s); see logs/service_x_node3.out"
)
NOT_READY = (
    "services[x] on node3 was not ready within 5s (tcp 127.0.0.4:9000, timeout=5s); "
    "see logs/service_x_node3.out"
)


def test_an_exit_before_ready_fails_the_job_though_not_critical(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GATE, tmp_path)
        await h.settle()
        assert [h.phase(n) for n in X] == ["Starting"] * 3
        assert not h.store.specs["service_x_node3"].critical
        h.prober.ready.add("service_x_node1")
        await h.advance(1)
        h.exit("service_x_node3", 127)  # restart: never (an owner's default)
        await h.settle()
        assert h.store.job.exit_code == 1
        assert h.store.job.reason == EXITED_127
        assert str(h.store.job.phase) == "Failed"
        # What was started is torn down; the next stage never began.
        assert not h.backend.live
        assert [h.phase(n) for n in X] == ["Stopped", "Stopped", "Failed"]
        assert h.backend.launched("service_app") == 0
        assert "JobFailed" in h.reasons("job")

    run(body())


def test_not_ready_within_the_timeout_fails_the_job_though_not_critical(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GATE, tmp_path)
        await h.settle()
        h.prober.ready.update(X[:2])
        await h.advance(4.5)
        assert not h.store.job.teardown_requested
        assert ("service_x_node3", signal.SIGKILL) not in h.backend.signals
        await h.advance(0.5)
        assert h.store.job.exit_code == 1
        assert h.store.job.reason == NOT_READY
        failed = [e for e in h.events if e.reason == "ProbeFailed"]
        assert [(e.object, e.message) for e in failed] == [
            ("instance/service_x_node3", NOT_READY + "; last probe: connection refused")
        ]
        assert not h.backend.live and h.backend.launched("service_app") == 0

    run(body())


def test_restarts_during_the_gate_do_not_reset_its_deadline(tmp_path: Path) -> None:
    recipe = GATE.replace("    nodes: 3\n", "    nodes: 3\n    restart: {policy: on-failure}\n")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        h.prober.ready.update(X[:2])
        await h.advance(1)
        h.exit("service_x_node3", 1)
        await h.settle()
        assert h.phase("service_x_node3") == "BackOff"  # its policy brings it back
        await h.advance(1)
        assert h.phase("service_x_node3") == "Starting"
        assert not h.store.job.teardown_requested
        await h.advance(3)  # 5 s after the stage began, 3 s into the second attempt
        assert h.store.job.reason == NOT_READY
        assert h.backend.launched("service_x_node3") == 2

    run(body())


def test_the_gate_times_out_a_member_still_backing_off(tmp_path: Path) -> None:
    policy = "    restart: {policy: on-failure, backoff_seconds: 30}\n"
    recipe = GATE.replace("    nodes: 3\n", "    nodes: 3\n" + policy)

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        h.prober.ready.update(X[:2])
        h.exit("service_x_node3", 1)
        await h.settle()
        await h.advance(4.9)
        assert h.phase("service_x_node3") == "BackOff" and not h.store.job.teardown_requested
        await h.advance(0.1)  # no probe runs: the job controller's own timer
        assert h.store.job.reason == NOT_READY
        assert h.phase("service_x_node3") == "Stopped"

    run(body())


def test_a_spent_restart_budget_before_ready_fails_the_gate(tmp_path: Path) -> None:
    policy = "    restart: {policy: on-failure, backoff_seconds: 0.1, max_restarts: 1}\n"
    recipe = GATE.replace("    nodes: 3\n", "    nodes: 3\n" + policy)

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        h.exit("service_x_node3", 127)
        await h.settle()
        await h.advance(0.1)
        h.exit("service_x_node3", 127)
        await h.settle()
        assert "GaveUp" in h.reasons("instance/service_x_node3")
        assert h.store.job.reason == EXITED_127

    run(body())


def test_after_the_gate_a_non_critical_exit_is_only_recorded(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GATE, tmp_path)
        await h.settle()
        h.prober.ready.update(X)
        await h.advance(1)
        assert h.backend.launched("service_app") == 1
        assert str(h.store.job.phase) == "Running"
        h.exit("service_x_node3", 3)
        await h.advance(60)
        assert h.phase("service_x_node3") == "Failed"
        assert "Exited" in h.reasons("instance/service_x_node3")
        assert not h.store.job.teardown_requested
        assert str(h.store.job.phase) == "Running"
        assert "service_app" in h.backend.live

    run(body())


def test_after_the_gate_a_late_restart_not_ready_in_time_falls_to_its_policy(
    tmp_path: Path,
) -> None:
    recipe = GATE.replace("    nodes: 3\n", "    nodes: 3\n    restart: {policy: on-failure}\n")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        h.prober.ready.update(X)
        await h.advance(1)
        assert str(h.store.job.phase) == "Running"
        h.prober.ready.discard("service_x_node3")
        h.exit("service_x_node3", 1)
        await h.settle()
        await h.advance(1)  # its backoff: a new attempt, probed from its own start
        assert h.phase("service_x_node3") == "Starting"
        await h.advance(5)
        assert ("service_x_node3", signal.SIGKILL) in h.backend.signals
        assert "ProbeFailed" in h.reasons("instance/service_x_node3")
        assert h.phase("service_x_node3") == "BackOff"
        assert not h.store.job.teardown_requested

    run(body())


def test_a_stage_a_live_edit_adds_has_a_gate_of_its_own(tmp_path: Path) -> None:
    import textwrap

    from srtr.controllers import edits
    from srtr.resources.diff import diff
    from srtr.resources.expand import local_allocation
    from srtr.resources.planning import plan_text_source

    added = "  - name: late\n    command: [late]\n    readiness: {port: 9100, timeout_seconds: 2}\n"

    async def body() -> None:
        h = Harness(GATE, tmp_path)
        await h.settle()
        h.prober.ready.update(X)
        await h.advance(1)
        assert str(h.store.job.phase) == "Running"
        _, new = plan_text_source(
            textwrap.dedent(GATE) + added, "recipe.yaml", local_allocation(3), h.store.desired.nodes
        )
        edits.apply(h.ctx, new, diff(h.store.desired, new))
        await h.settle()
        assert h.phase("service_late") == "Starting"
        await h.advance(2)
        assert h.store.job.exit_code == 1
        assert h.store.job.reason == (
            "services[late] on node1 was not ready within 2s (tcp 127.0.0.2:9100, timeout=2s); "
            "see logs/service_late.out"
        )

    run(body())


def test_launch_failure_counts_as_exit_127(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(CRITICAL, tmp_path)
        h.backend.fail_launch.add("service_db")
        await h.settle()
        assert h.store.job.exit_code == 1
        assert "LaunchFailed" in h.reasons("instance/service_db")

    run(body())


def test_second_stop_request_kills_everything_now(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(TIERS, tmp_path)
        await h.settle()
        for name in list(h.backend.live):
            h.backend.ignore_term.add(name)
        from srtr.controllers.manager import request_stop

        request_stop(h.ctx, signal.SIGINT)
        await h.settle()
        assert h.backend.live  # waiting out the grace
        request_stop(h.ctx, signal.SIGINT)
        await h.settle()
        assert not h.backend.live
        assert h.store.job.exit_code == 130
        assert h.ctx.done.is_set()

    run(body())


def test_ready_condition_follows_the_probe_and_keeps_its_transition_time(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(PROBED, tmp_path)
        await h.settle()
        # the first attempt runs at launch and fails
        failing = h.store.status["service_db"].conditions["Ready"]
        assert (failing.status, failing.reason) == ("False", "ProbeFailing")
        await h.advance(1)
        assert h.store.status["service_db"].conditions["Ready"].last_transition == (
            failing.last_transition
        )
        h.prober.ready.add("service_db")
        await h.advance(1)
        passed = h.store.status["service_db"].conditions["Ready"]
        assert (passed.status, passed.reason) == ("True", "ProbePassed")
        assert passed.last_transition > failing.last_transition
        assert h.store.job.conditions["Ready"].status == "True"
        assert h.store.job.observed_generation == h.store.job.generation

    run(body())


def test_restart_intent_stops_and_starts_the_instance_again(tmp_path: Path) -> None:
    from srtr.controllers import intents

    async def body() -> None:
        h = Harness(TIERS, tmp_path)
        await h.settle()
        h.backend.ignore_term.add("service_early")
        assert intents.restart(h.ctx, "service_early") == "restarting service_early"
        await h.settle()
        assert ("service_early", signal.SIGTERM) in h.backend.signals
        assert h.phase("service_early") == "Terminating"
        await h.advance(5)  # its stop_grace_seconds
        assert ("service_early", signal.SIGKILL) in h.backend.signals
        assert h.phase("service_early") == "Running"
        # a planned restart: no crash, so neither RESTARTS nor the budget moves
        assert h.store.status["service_early"].restarts == 0
        assert not h.store.status["service_early"].restart_times
        assert h.backend.launched("service_early") == 2
        assert not h.store.job.teardown_requested

    run(body())


def test_stop_intent_stops_for_good_and_refuses_unknown_names(tmp_path: Path) -> None:
    import pytest

    from srtr.controllers import intents

    async def body() -> None:
        h = Harness(RIDER, tmp_path)
        await h.settle()
        intents.stop(h.ctx, "service_rider")
        await h.settle()
        assert h.phase("service_rider") == "Stopped"
        await h.advance(60)
        assert h.backend.launched("service_rider") == 1
        with pytest.raises(intents.IntentError, match="no instance or service named 'nope'"):
            intents.restart(h.ctx, "nope")
        intents.teardown(h.ctx)
        await h.settle()
        assert h.store.job.phase == "Failed"
        with pytest.raises(intents.IntentError, match="the job has ended"):
            intents.restart(h.ctx, "service_owner")

    run(body())


REPLACE = """
name: t
services:
  - name: train
    command: [sleep, inf]
    nodes: 2
    critical: true
    replace_lost: true
  - name: side
    command: [sleep, inf]
    placement: {pool: train}
"""


def test_a_lost_node_is_replaced_by_a_spare(tmp_path: Path) -> None:
    import textwrap

    async def body() -> None:
        h = Harness(REPLACE, tmp_path, nodes=3)
        h.store.recipe_text = textwrap.dedent(REPLACE)
        await h.settle()
        assert h.store.desired.nodes.spares == ("node3",)
        h.backend.lose("service_train_node1")
        h.backend.lose("service_side_node1")
        await h.settle()
        assert not h.store.job.teardown_requested
        assert h.store.desired.nodes.pools["train"] == ("node3", "node2")
        assert h.backend.launched("service_train_node3") == 1
        assert h.backend.launched("service_side_node3") == 1
        assert "service_train_node1" not in h.store.specs
        assert "Replaced" in h.reasons("pool/train")
        assert h.store.job.generation == 2

    run(body())


def test_a_spare_waits_until_the_cut_off_node_has_fenced_its_instances(tmp_path: Path) -> None:
    """A node lost to a partition may still run its instances until its agent's lease and
    their grace ran out (the backend's `fenced_in`): the spare starts only after that."""
    import textwrap

    async def body() -> None:
        h = Harness(REPLACE, tmp_path, nodes=3)
        h.store.recipe_text = textwrap.dedent(REPLACE)
        await h.settle()
        h.backend.lose("service_train_node1", fenced_in=7.5)
        h.backend.lose("service_side_node1", fenced_in=7.5)
        await h.settle()
        assert h.phase("service_train_node1") == "Lost"
        assert "Fencing" in h.reasons("pool/train")
        assert "Replaced" not in h.reasons("pool/train")
        assert h.backend.launched("service_train_node3") == 0
        assert not h.store.job.teardown_requested  # a spare is coming: not a failure
        await h.advance(7.4)
        assert h.backend.launched("service_train_node3") == 0
        await h.advance(0.1)
        assert "Replaced" in h.reasons("pool/train")
        assert h.store.desired.nodes.pools["train"] == ("node3", "node2")
        assert h.backend.launched("service_train_node3") == 1
        assert h.backend.launched("service_side_node3") == 1

    run(body())


def test_a_lost_critical_owner_without_a_spare_fails_the_job(tmp_path: Path) -> None:
    import textwrap

    async def body() -> None:
        h = Harness(REPLACE, tmp_path, nodes=2)
        h.store.recipe_text = textwrap.dedent(REPLACE)
        await h.settle()
        h.backend.lose("service_train_node1")
        await h.settle()
        assert h.store.job.exit_code == 1
        assert "was lost with its node node1" in h.store.job.reason

    run(body())


POOL4 = """
name: ids
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 4
"""


def test_a_launched_attempt_is_identified_by_the_next_launch_at_the_latest(
    tmp_path: Path,
) -> None:
    """The guard kills only what state.json identifies: the identity is read after the
    spawn (not waiting for the exec), but before the next launch, never a stage later."""

    async def body() -> None:
        h = Harness(POOL4, tmp_path)
        order: list[str] = []
        launch, pids = h.backend.launch, {}

        async def recording_launch(spec: LaunchSpec) -> int:
            order.append(f"launch {spec.name}")
            pids[spec.name] = await launch(spec)
            return pids[spec.name]

        def identity(name: str) -> dict[str, int]:
            order.append(f"identify {name}")
            return {"pid": pids[name], "start": 1}

        h.backend.launch = recording_launch  # type: ignore[method-assign]
        h.backend.identity = identity  # type: ignore[method-assign,assignment]
        await h.settle()
        names = [f"service_owner_node{k}" for k in range(1, 5)]
        launches = [order.index(f"launch {n}") for n in names]
        for earlier, later in itertools.pairwise(names):
            assert order.index(f"identify {earlier}") < order.index(f"launch {later}")
        assert launches == sorted(launches)
        assert not h.store.unidentified
        assert all(h.store.status[n].identity == {"pid": pids[n], "start": 1} for n in names)

    run(body())
