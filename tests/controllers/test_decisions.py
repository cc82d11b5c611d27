"""The controllers' pure decisions, from plain values: no store, backend, clock or loop."""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import replace

import pytest

from srtr.controllers.decisions import (
    EndJob,
    ExitDecision,
    Finish,
    Gate,
    GiveUp,
    Restart,
    RestartNow,
    StageStep,
    after_exit,
    could_not_start,
    critical_failure,
    exited_unready,
    job_end,
    next_stage,
    open_stage,
    readiness_deadline,
    rolled_out,
    stage_done,
    stage_gate,
    unstartable,
)
from srtr.controllers.teardown_decisions import (
    StopStep,
    TeardownStep,
    TierMemo,
    lowest_tier,
    stop_step,
    stops_due,
    teardown_step,
    tier_step,
)
from srtr.resources.objects import (
    InstanceKind,
    InstanceSpec,
    ProbeKind,
    ProbeSpec,
    RestartSpec,
    Stage,
)
from srtr.store.status import InstanceStatus, Phase, UserAction

POLICY = RestartSpec(
    policy="on-failure",
    backoff_seconds=1.0,
    max_backoff_seconds=8.0,
    reset_after_seconds=100.0,
    max_restarts=3,
    window_seconds=60.0,
)


def spec(name: str = "service_a", **changes: object) -> InstanceSpec:
    base = InstanceSpec(
        name=name,
        service="a",
        kind=InstanceKind.SERVICE,
        type="generic",
        index=0,
        node="node1",
        node_ip="10.0.0.1",
        argv=("sleep", "inf"),
        env=(),
        log=f"logs/{name}.out",
        stage="after_frontend",
        shutdown_tier=0,
        stop_grace_seconds=5.0,
        critical=False,
        terminal=False,
        restart=POLICY,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def exited(code: int | None = 1, **changes: object) -> InstanceStatus:
    """An instance whose attempt 0 started at t=0 and has just ended with `code`."""
    status = InstanceStatus(
        phase=Phase.RUNNING, attempt=0, exited_attempt=0, exit_code=code, started_at=0.0
    )
    for key, value in changes.items():
        setattr(status, key, value)
    return status


def decide(s: InstanceSpec, st: InstanceStatus, now: float = 10.0, **kw: object) -> ExitDecision:
    args: dict[str, object] = {"now": now, "jitter": 1.0, "tearing_down": False, **kw}
    return after_exit(s, st, **args)  # type: ignore[arg-type]


# --- after_exit ---------------------------------------------------------------------------------


def test_a_failed_exit_backs_off_by_the_base_delay() -> None:
    assert decide(spec(), exited(1)) == Restart(
        delay=1.0, start_at=11.0, backoff_index=1, restarts=0, window_start=-50.0, code=1
    )


@pytest.mark.parametrize(("index", "delay"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 8.0), (99, 8.0)])
def test_backoff_doubles_up_to_the_cap(index: int, delay: float) -> None:
    outcome = decide(spec(), exited(1, backoff_index=index))
    assert isinstance(outcome, Restart)
    assert (outcome.delay, outcome.backoff_index) == (delay, index + 1)


def test_jitter_scales_the_delay_but_never_past_the_cap() -> None:
    spread = decide(spec(), exited(1, backoff_index=1), jitter=1.2)
    capped = decide(spec(), exited(1, backoff_index=3), jitter=1.2)
    assert isinstance(spread, Restart) and isinstance(capped, Restart)
    assert spread.delay == pytest.approx(2.4)
    assert capped.delay == 8.0


def test_a_stable_run_forgives_earlier_crashes() -> None:
    outcome = decide(spec(), exited(1, backoff_index=3, started_at=5.0), now=105.0)
    assert isinstance(outcome, Restart)
    assert (outcome.delay, outcome.backoff_index) == (1.0, 1)


def test_unknown_exit_status_counts_as_a_failure() -> None:
    outcome = decide(spec(), exited(None))
    assert isinstance(outcome, Restart) and outcome.code == 1


def test_a_clean_exit_under_on_failure_succeeds() -> None:
    assert decide(spec(), exited(0)) == Finish(Phase.SUCCEEDED)


def test_always_restarts_a_clean_exit() -> None:
    always = spec(restart=replace(POLICY, policy="always"))
    assert isinstance(decide(always, exited(0)), Restart)


def test_never_fails_with_the_exit() -> None:
    never = spec(restart=replace(POLICY, policy="never"))
    assert decide(never, exited(3)) == Finish(Phase.FAILED)


def test_a_benchmark_never_restarts() -> None:
    bench = spec("benchmark", kind=InstanceKind.BENCHMARK, restart=replace(POLICY, policy="always"))
    assert decide(bench, exited(2)) == Finish(Phase.FAILED)
    assert decide(bench, exited(0)) == Finish(Phase.SUCCEEDED)


def test_the_budget_counts_restarts_inside_the_window_only() -> None:
    times = deque([1.0, 45.0, 50.0, 55.0])  # t=1 left the 60 s window at t=61
    assert decide(spec(), exited(1, restart_times=times), now=100.0) == GiveUp(
        restarts=3, window_start=40.0, code=1
    )
    outcome = decide(spec(), exited(1, restart_times=deque([1.0, 45.0, 50.0])), now=100.0)
    assert isinstance(outcome, Restart) and outcome.restarts == 2


def test_a_restart_at_the_window_edge_has_left_it() -> None:
    outcome = decide(spec(), exited(1, restart_times=deque([40.0, 50.0, 55.0])), now=100.0)
    assert isinstance(outcome, Restart) and outcome.restarts == 2


def test_a_stopped_instance_stays_stopped() -> None:
    assert decide(spec(), exited(143, stop_sent_at=9.0)) == Finish(Phase.STOPPED)
    assert decide(spec(), exited(0), tearing_down=True) == Finish(Phase.STOPPED)


def test_a_user_restart_skips_backoff_and_budget() -> None:
    spent = deque([5.0, 6.0, 7.0])
    status = exited(143, user_action=UserAction.RESTART, stop_sent_at=9.0, restart_times=spent)
    assert decide(spec(), status) == RestartNow()


def test_a_user_restart_during_teardown_is_a_stop() -> None:
    status = exited(143, user_action=UserAction.RESTART, stop_sent_at=9.0)
    assert decide(spec(), status, tearing_down=True) == Finish(Phase.STOPPED)


def test_deciding_changes_nothing_and_returns_a_frozen_value() -> None:
    status = exited(1, restart_times=deque([-100.0, 5.0]), backoff_index=2)
    before = copy.deepcopy(status)
    outcome = decide(spec(), status)
    assert status == before  # the old restart time is still there: pruning is the store's
    assert isinstance(outcome, Restart)
    with pytest.raises(AttributeError):
        outcome.delay = 0.0  # type: ignore[misc]


# --- launch stages ------------------------------------------------------------------------------

STAGES = (
    Stage("before_workers", "before_workers", ("service_db",)),
    Stage("workers", "workers", ("worker_0", "worker_1")),
    Stage("frontend", "frontend", ("frontend",)),
)
SPECS = {
    "service_db": spec("service_db", critical=True),
    "worker_0": spec("worker_0", kind=InstanceKind.WORKER, critical=True),
    "worker_1": spec("worker_1", kind=InstanceKind.WORKER),
    "frontend": spec("frontend", kind=InstanceKind.FRONTEND, critical=True),
}


def statuses(**phases: Phase) -> dict[str, InstanceStatus]:
    """Activated statuses in the given phases (Running and Ready ones are up); others Pending."""
    out = {name: InstanceStatus() for name in SPECS}
    for name, phase in phases.items():
        up = phase in (Phase.RUNNING, Phase.READY)
        out[name] = InstanceStatus(
            phase=phase, activated=True, attempt=0, ready_attempt=0 if up else None
        )
    return out


def test_the_first_stage_begins_with_all_its_members() -> None:
    step = next_stage(STAGES, SPECS, statuses(), set())
    assert step == StageStep(activate=("service_db",), started=(1, STAGES[0]))


def test_a_stage_waits_until_every_member_is_ready() -> None:
    step = next_stage(STAGES, SPECS, statuses(service_db=Phase.STARTING), set())
    assert step == StageStep()


def test_ready_stages_pass_and_the_next_one_begins() -> None:
    step = next_stage(STAGES, SPECS, statuses(service_db=Phase.READY), set())
    assert step == StageStep(
        activate=("worker_0", "worker_1"), started=(2, STAGES[1]), passed=((1, "before_workers"),)
    )


def test_a_non_critical_member_that_failed_lets_its_stage_pass() -> None:
    up = statuses(service_db=Phase.READY, worker_0=Phase.RUNNING, worker_1=Phase.FAILED)
    step = next_stage(STAGES, SPECS, up, {"before_workers"})
    assert step.passed == ((2, "workers"),) and step.started == (3, STAGES[2])


def test_a_critical_member_that_failed_holds_its_stage() -> None:
    down = statuses(service_db=Phase.READY, worker_0=Phase.FAILED, worker_1=Phase.RUNNING)
    assert next_stage(STAGES, SPECS, down, {"before_workers"}) == StageStep()


def test_all_up_once_every_stage_passed() -> None:
    up = statuses(
        service_db=Phase.READY, worker_0=Phase.RUNNING, worker_1=Phase.RUNNING, frontend=Phase.READY
    )
    step = next_stage(STAGES, SPECS, up, {"before_workers", "workers"})
    assert step == StageStep(passed=((3, "frontend"),), all_up=True)


def test_members_an_edit_added_to_a_passed_stage_start_before_later_stages() -> None:
    # As at the first launch: the later stage waits until the late member is up.
    up = statuses(service_db=Phase.READY, worker_0=Phase.RUNNING, worker_1=Phase.STARTING)
    up["worker_1"].activated = False
    step = next_stage(STAGES, SPECS, up, {"before_workers", "workers"})
    assert step == StageStep(activate=("worker_1",), late=("worker_1",))
    up["worker_1"].activated = up["worker_1"].late = True  # what activate_late did
    assert next_stage(STAGES, SPECS, up, {"before_workers", "workers"}) == StageStep()
    up["worker_1"].ready_attempt, up["worker_1"].phase = 0, Phase.RUNNING
    step = next_stage(STAGES, SPECS, up, {"before_workers", "workers"})
    assert step == StageStep(activate=("frontend",), started=(3, STAGES[2]), settled=("worker_1",))


def test_a_grown_pools_new_riders_wait_for_its_new_owners() -> None:
    stages = (Stage("owners", "after_frontend", ("o1", "o2")), Stage("riders", "x", ("r1", "r2")))
    specs = {n: spec(n) for n in ("o1", "o2", "r1", "r2")}
    up = {
        n: InstanceStatus(phase=Phase.RUNNING, activated=True, attempt=0, ready_attempt=0)
        for n in ("o1", "r1")
    }
    up |= {"o2": InstanceStatus(), "r2": InstanceStatus()}
    both = {"owners", "riders"}
    assert next_stage(stages, specs, up, both) == StageStep(
        activate=("o2",), late=("o2",), all_up=False
    )
    up["o2"] = InstanceStatus(phase=Phase.STARTING, activated=True, attempt=0, late=True)
    assert next_stage(stages, specs, up, both) == StageStep()
    assert not rolled_out(up, specs)
    up["o2"].ready_attempt, up["o2"].phase = 0, Phase.READY
    assert next_stage(stages, specs, up, both) == StageStep(
        activate=("r2",), late=("r2",), settled=("o2",)
    )


def test_a_benchmark_lets_its_stage_pass_once_started() -> None:
    bench = spec("benchmark", kind=InstanceKind.BENCHMARK)
    assert not stage_done(bench, InstanceStatus())
    assert stage_done(bench, InstanceStatus(phase=Phase.FAILED, attempt=0))


# --- the stage gate ------------------------------------------------------------------------------

NEVER = replace(POLICY, policy="never")
TCP = ProbeSpec(kind=ProbeKind.TCP, timeout_seconds=5.0, interval_seconds=1.0, port=9000)
GATED = Stage("after_frontend/x", "after_frontend", ("service_x_node1", "service_x_node3"))
GATED_SPECS = {
    n: spec(n, service="x", node=n.rsplit("_", 1)[1], probe=TCP, restart=NEVER)
    for n in GATED.instances
}


def member(phase: Phase, *, ready: bool = False, code: int | None = None) -> InstanceStatus:
    """An activated member on attempt 0 in `phase`, ready or not, with exit `code`."""
    return InstanceStatus(
        phase=phase,
        activated=True,
        attempt=0,
        exited_attempt=0 if phase not in (Phase.STARTING, Phase.READY) else -1,
        ready_attempt=0 if ready else None,
        exit_code=code,
        started_at=0.0,
    )


def gate(now: float = 1.0, **phases: InstanceStatus) -> Gate:
    st = {n: member(Phase.STARTING) for n in GATED.instances}
    st.update({f"service_x_{k}": v for k, v in phases.items()})
    return stage_gate(GATED, GATED_SPECS, st, started_at=0.0, now=now)


def test_an_exit_before_the_probe_passed_fails_the_gate_critical_or_not() -> None:
    outcome = gate(node3=member(Phase.FAILED, code=127))
    assert outcome == Gate(
        failed="service_x_node3",
        reason="services[x] exited with code 127 on node3 before its readiness probe passed "
        "(tcp 10.0.0.1:9000, timeout=5s); see logs/service_x_node3.out",
    )
    assert not GATED_SPECS["service_x_node3"].critical


def test_a_clean_exit_before_the_probe_passed_fails_the_gate_too() -> None:
    # srtctl: the process died before its probe passed; the code does not matter.
    assert gate(node1=member(Phase.SUCCEEDED, code=0)).failed == "service_x_node1"


def test_a_member_not_ready_by_the_deadline_fails_the_gate() -> None:
    assert gate(now=4.5) == Gate(wake_in=0.5)
    assert gate(now=5.0, node1=member(Phase.READY, ready=True)) == Gate(
        failed="service_x_node3",
        reason="services[x] on node3 was not ready within 5s (tcp 10.0.0.1:9000, timeout=5s); "
        "see logs/service_x_node3.out",
        timed_out=True,
    )


def test_restarts_do_not_reset_the_gates_clock() -> None:
    # Backing off after a crash, or starting again (a new attempt began at t=4): the
    # deadline is still 5 s after the stage began.
    backing_off = member(Phase.BACKOFF, code=1)
    assert gate(now=3.0, node1=backing_off) == Gate(wake_in=2.0)
    assert gate(now=5.0, node1=backing_off).failed == "service_x_node1"
    again = member(Phase.STARTING)
    again.started_at = 4.0
    assert gate(now=5.0, node1=again).timed_out


def test_an_exit_is_reported_before_a_timeout() -> None:
    outcome = gate(now=9.0, node3=member(Phase.FAILED, code=2))
    assert outcome.failed == "service_x_node3" and not outcome.timed_out


def test_ready_members_and_members_without_a_probe_hold_no_deadline() -> None:
    ready = member(Phase.READY, ready=True)
    assert gate(now=99.0, node1=ready, node3=ready) == Gate()
    no_probe = {n: replace(s, probe=None) for n, s in GATED_SPECS.items()}
    st = {n: member(Phase.FAILED, code=1, ready=True) for n in GATED.instances}
    st["service_x_node3"] = member(Phase.FAILED, code=1)  # it ran, then failed: no probe
    assert stage_gate(GATED, no_probe, st, started_at=0.0, now=99.0) == Gate()
    # One that never ran (code 127) does fail it: see the tests of `could_not_start`.
    st["service_x_node3"] = member(Phase.FAILED, code=127)
    assert stage_gate(GATED, no_probe, st, started_at=0.0, now=99.0).failed == "service_x_node3"


def test_a_ready_member_that_exits_later_does_not_fail_the_gate() -> None:
    # Its probe passed; a non-critical exit afterwards is only recorded (S-70).
    done = member(Phase.FAILED, ready=True, code=1)
    assert gate(now=1.0, node1=done) == Gate(wake_in=4.0)
    assert stage_done(GATED_SPECS["service_x_node1"], done)


def test_a_member_that_exited_unready_holds_its_stage() -> None:
    name = "service_x_node1"
    failed = member(Phase.FAILED, code=1)
    assert exited_unready(GATED_SPECS[name], failed)
    assert not stage_done(GATED_SPECS[name], failed)
    st = {n: member(Phase.READY, ready=True) for n in GATED.instances}
    st[name] = failed
    assert next_stage((GATED,), GATED_SPECS, st, set()) == StageStep()


def test_what_is_not_an_exit_before_ready() -> None:
    probed = GATED_SPECS["service_x_node1"]
    assert not exited_unready(probed, member(Phase.STOPPED, code=143))  # stopped, not exited
    assert not exited_unready(probed, member(Phase.BACKOFF, code=1))  # coming back
    skipped = InstanceStatus(phase=Phase.SUCCEEDED, activated=True)  # never launched
    assert not exited_unready(probed, skipped)
    bench = replace(probed, kind=InstanceKind.BENCHMARK)
    assert not exited_unready(bench, member(Phase.FAILED, code=1))


def test_the_open_stage_is_the_first_not_passed_once_it_began() -> None:
    st = statuses(service_db=Phase.READY, worker_0=Phase.STARTING, worker_1=Phase.RUNNING)
    assert open_stage(STAGES, st, {"before_workers"}) == STAGES[1]
    assert open_stage(STAGES, st, {"before_workers", "workers"}) is None  # frontend not begun
    assert open_stage(STAGES, st, {s.name for s in STAGES}) is None


def test_worker_and_frontend_members_are_named_like_the_reference() -> None:
    worker = replace(GATED_SPECS["service_x_node1"], kind=InstanceKind.WORKER, index=2)
    worker = replace(worker, service="agg", name="worker_agg_2", log="logs/node1_agg_w2.out")
    http = ProbeSpec(ProbeKind.HTTP, 30.0, 1.0, port=8000, path="/health", status=200)
    front = replace(worker, kind=InstanceKind.FRONTEND, name="frontend", probe=http)
    front = replace(front, log="logs/frontend.out")
    stage = Stage("workers", "workers", ("worker_agg_2", "frontend"))
    specs = {"worker_agg_2": worker, "frontend": front}
    st = {"worker_agg_2": member(Phase.FAILED, code=1), "frontend": member(Phase.STARTING)}
    assert stage_gate(stage, specs, st, started_at=0.0, now=1.0).reason == (
        "roles.agg worker 2 exited with code 1 on node1 before its readiness probe passed "
        "(tcp 10.0.0.1:9000, timeout=5s); see logs/node1_agg_w2.out"
    )
    st["worker_agg_2"] = member(Phase.READY, ready=True)
    assert stage_gate(stage, specs, st, started_at=0.0, now=30.0).reason == (
        "frontend on node1 was not ready within 30s "
        "(http://10.0.0.1:8000/health -> 200, timeout=30s); see logs/frontend.out"
    )


def test_the_readiness_deadline_counts_from_the_stage_while_the_gate_is_open() -> None:
    restarted = member(Phase.STARTING)
    restarted.started_at = 40.0
    probed = GATED_SPECS["service_x_node1"]
    assert readiness_deadline(probed, restarted, gate_started_at=10.0) == 15.0
    assert readiness_deadline(probed, restarted, gate_started_at=None) == 45.0  # after the gate


# --- the end of the job -------------------------------------------------------------------------


def test_a_failed_critical_instance_fails_the_job() -> None:
    down = statuses(worker_0=Phase.FAILED)
    down["worker_0"].exit_code = 3
    assert critical_failure(SPECS, down, set(SPECS), spares=False) == (
        "critical instance worker_0 on node1 failed (exit code 3); see logs/worker_0.out"
    )
    down["worker_0"].exit_signal = 9
    assert "(exit signal 9)" in (critical_failure(SPECS, down, set(SPECS), spares=False) or "")


def test_only_desired_critical_instances_count() -> None:
    down = statuses(worker_0=Phase.FAILED, worker_1=Phase.FAILED)
    assert critical_failure(SPECS, down, set(SPECS) - {"worker_0"}, spares=False) is None


def test_a_lost_critical_instance_fails_the_job_unless_a_spare_replaces_it() -> None:
    lost = statuses(service_db=Phase.LOST)
    assert critical_failure(SPECS, lost, set(SPECS), spares=True) == (
        "critical instance service_db was lost with its node node1"
    )
    replaced = {**SPECS, "service_db": replace(SPECS["service_db"], replace_lost=True)}
    assert critical_failure(replaced, lost, set(SPECS), spares=True) is None
    assert critical_failure(replaced, lost, set(SPECS), spares=False) is not None


def test_the_job_ends_with_the_benchmark() -> None:
    specs = {**SPECS, "benchmark": spec("benchmark", kind=InstanceKind.BENCHMARK)}
    running = {**statuses(), "benchmark": InstanceStatus(phase=Phase.RUNNING, attempt=0)}
    assert job_end(specs, running) is None
    running["benchmark"] = InstanceStatus(phase=Phase.FAILED, attempt=0, exit_code=None)
    assert job_end(specs, running) == EndJob(1, "benchmark exited with code 1")


def test_the_job_ends_with_the_code_of_its_first_failed_terminal_instance() -> None:
    specs = {**SPECS, "worker_0": replace(SPECS["worker_0"], terminal=True)}
    specs["worker_1"] = replace(SPECS["worker_1"], terminal=True)
    st = statuses(worker_0=Phase.SUCCEEDED, worker_1=Phase.RUNNING)
    assert job_end(specs, st) is None
    st["worker_1"] = InstanceStatus(phase=Phase.FAILED, exit_code=4)
    failed = specs["worker_1"]
    assert job_end(specs, st) == EndJob(
        4,
        f"terminal service(s) failed (first failed: worker_1 on {failed.node}, exit code 4; "
        f"see {failed.log})",
    )
    st["worker_1"] = InstanceStatus(phase=Phase.SUCCEEDED, exit_code=0)
    assert job_end(specs, st) == EndJob(0, "terminal service(s) finished (every exit code 0)")


def test_the_first_failed_terminal_instance_decides_not_the_worst_code() -> None:
    # Rank 1 fails first with 1; rank 0 aborts later with 134: the job is rank 1's failure.
    specs = {n: replace(SPECS[n], terminal=True) for n in ("worker_0", "worker_1")}
    specs = {**SPECS, **specs}
    st = statuses()
    st["worker_0"] = InstanceStatus(phase=Phase.FAILED, exit_code=134, exited_at=20.0)
    st["worker_1"] = InstanceStatus(phase=Phase.FAILED, exit_code=1, exited_at=10.0)
    end = job_end(specs, st)
    assert end is not None and end.exit_code == 1
    assert "first failed: worker_1 " in end.reason and "134" not in end.reason


def test_of_several_failed_critical_instances_the_first_is_named() -> None:
    specs = {n: replace(SPECS[n], critical=True) for n in ("worker_0", "worker_1")}
    st = {
        "worker_0": InstanceStatus(phase=Phase.FAILED, exit_code=134, exited_at=20.0),
        "worker_1": InstanceStatus(phase=Phase.FAILED, exit_code=1, exited_at=10.0),
    }
    why = critical_failure(specs, st, set(specs), spares=False)
    assert why is not None and why.startswith("critical instance worker_1 ")


def test_a_job_without_benchmark_or_terminal_instances_holds() -> None:
    assert job_end(SPECS, statuses(service_db=Phase.FAILED)) is None


def test_an_edit_is_rolled_out_once_every_instance_runs_its_spec() -> None:
    up = statuses(service_db=Phase.READY, worker_0=Phase.RUNNING)
    assert rolled_out(up, ["service_db", "worker_0"])
    assert not rolled_out(up, ["service_db", "worker_1"])  # not activated yet
    up["worker_0"].user_action = UserAction.RESTART
    assert not rolled_out(up, ["service_db", "worker_0"])


# --- teardown -----------------------------------------------------------------------------------

TIERED = {
    "a": spec("a", shutdown_tier=0, stop_grace_seconds=5.0),
    "b": spec("b", shutdown_tier=0, stop_grace_seconds=2.0),
    "c": spec("c", shutdown_tier=1),
}


def running(**changes: object) -> InstanceStatus:
    status = InstanceStatus(phase=Phase.RUNNING, attempt=0)
    for key, value in changes.items():
        setattr(status, key, value)
    return status


def test_teardown_stops_the_lowest_tier_first() -> None:
    st = {"a": running(), "b": running(stop_sent_at=1.0), "c": running()}
    assert teardown_step(TIERED, st, kill_now=False) == TeardownStep(
        tier=0, members=("a", "b"), fresh=("a",)
    )


def test_the_next_tier_waits_until_the_lower_one_is_gone() -> None:
    st = {"a": InstanceStatus(phase=Phase.STOPPED), "b": InstanceStatus(), "c": running()}
    assert teardown_step(TIERED, st, kill_now=False) == TeardownStep(
        tier=1, members=("c",), fresh=("c",)
    )


def test_kill_now_kills_everything_alive_not_yet_killed() -> None:
    st = {"a": running(kill_sent=True), "b": running(), "c": running()}
    assert teardown_step(TIERED, st, kill_now=True).kill == ("b", "c")


def test_teardown_finishes_when_nothing_is_alive() -> None:
    st = {"a": InstanceStatus(), "b": InstanceStatus(phase=Phase.FAILED), "c": InstanceStatus()}
    assert teardown_step(TIERED, st, kill_now=True) == TeardownStep(finish=True)


def test_a_tier_step_from_the_memo_is_the_full_step_while_nothing_came_alive() -> None:
    st = {"a": running(), "b": running(stop_sent_at=1.0), "c": running()}
    memo = TierMemo(came_alive=0, generation=1, tier=0, members=["a", "b"])
    assert tier_step(st, memo) == teardown_step(TIERED, st, kill_now=False)
    st["a"] = InstanceStatus(phase=Phase.STOPPED)  # exits only shrink the tier
    assert tier_step(st, memo) == teardown_step(TIERED, st, kill_now=False)
    st["b"] = InstanceStatus(phase=Phase.STOPPED)
    assert tier_step(st, memo) is None  # drained: the next tier needs the full pass
    assert teardown_step(TIERED, st, kill_now=False).tier == 1


def test_lowest_tier() -> None:
    assert lowest_tier(TIERED, ["c", "b"]) == (0, ["b"])


def test_stop_sends_sigterm_once_then_waits_out_the_grace() -> None:
    assert stop_step(TIERED["a"], running(), now=10.0) == StopStep(term=True, wait=5.0)
    assert stop_step(TIERED["a"], running(stop_sent_at=10.0), now=12.0) == StopStep(wait=3.0)


def test_stop_sends_sigkill_once_the_grace_passed() -> None:
    assert stop_step(TIERED["a"], running(stop_sent_at=10.0), now=15.0) == StopStep(kill=True)
    zero = replace(TIERED["a"], stop_grace_seconds=0.0)
    assert stop_step(zero, running(), now=10.0) == StopStep(term=True, kill=True)


def test_nothing_is_left_to_do_once_killed() -> None:
    assert stop_step(TIERED["a"], running(stop_sent_at=1.0, kill_sent=True), 99.0) == StopStep()
    assert stop_step(TIERED["a"], running(kill_sent=True), 99.0) == StopStep(term=True)


def test_stops_due_are_the_members_stop_step_would_signal() -> None:
    specs = {n: spec(n, stop_grace_seconds=5.0) for n in "abcz"}
    st = {
        "a": running(),  # no SIGTERM yet
        "b": running(stop_sent_at=10.0),  # waiting: 3 s of its grace left
        "c": running(stop_sent_at=4.0),  # its grace passed
        "z": running(stop_sent_at=1.0, kill_sent=True),  # nothing left to do
    }
    due, deadline = stops_due(specs, st, ["a", "b", "c", "z"], now=12.0)
    assert due == [n for n in st if (s := stop_step(specs[n], st[n], 12.0)).term or s.kill]
    assert due == ["a", "c"]
    assert deadline == 15.0
    assert stops_due(specs, st, ["z"], now=12.0) == ([], None)


# --- a program that never ran (issue 21) ---------------------------------------------------------

NO_PROBE = Stage("after_frontend", "after_frontend", ("service_a_node1", "service_a_node2"))
NO_PROBE_SPECS = {
    n: spec(n, service="a", argv=("srtr-no-such-tool", "--serve"), node=n[-5:])
    for n in NO_PROBE.instances
}


def never_ran(error: str | None = None, code: int = 127) -> InstanceStatus:
    """Ended for good (restart: never) without running: a failed launch or exit 127."""
    return InstanceStatus(
        phase=Phase.FAILED,
        activated=True,
        attempt=0,
        exited_attempt=0,
        ready_attempt=0,  # no probe: "ready" once launched
        exit_code=code,
        launch_error=error,
    )


def test_a_member_without_a_probe_that_never_ran_fails_the_gate() -> None:
    up = InstanceStatus(phase=Phase.RUNNING, activated=True, attempt=0, ready_attempt=0)
    st = {"service_a_node1": up, "service_a_node2": never_ran()}
    gate = stage_gate(NO_PROBE, NO_PROBE_SPECS, st, started_at=0.0, now=1.0)
    assert gate.failed == "service_a_node2"
    assert gate.reason == (
        "services[a] exited with code 127 on node2 at once: its program was not found "
        "(command: srtr-no-such-tool --serve); see logs/service_a_node2.out"
    )
    # srtctl would let this stage pass: the member is "ready", and not critical.
    assert stage_done(NO_PROBE_SPECS["service_a_node2"], st["service_a_node2"])


def test_a_launch_that_never_started_fails_the_gate_with_the_backends_reason() -> None:
    error = "cannot start 'srtr-no-such-tool': [Errno 2] No such file or directory"
    st = {n: never_ran(error) for n in NO_PROBE.instances}
    gate = stage_gate(NO_PROBE, NO_PROBE_SPECS, st, started_at=0.0, now=1.0)
    assert gate.reason == (
        f"services[a] could not be started on node1: {error} "
        "(command: srtr-no-such-tool --serve); see logs/service_a_node1.out"
    )


def test_a_service_none_of_whose_instances_ran_fails_the_job_after_the_gate() -> None:
    names = set(NO_PROBE.instances)
    st = {n: never_ran(code=126) for n in names}
    assert unstartable(NO_PROBE_SPECS, st, names) == (
        "services[a] exited with code 126 on node1 at once: its program could not be "
        "executed (command: srtr-no-such-tool --serve); see logs/service_a_node1.out"
    )
    # One instance that ran is enough: the others' exits are the service's own business.
    st["service_a_node2"] = replace(never_ran(), exit_code=3)
    assert unstartable(NO_PROBE_SPECS, st, names) is None
    assert not could_not_start(NO_PROBE_SPECS["service_a_node2"], st["service_a_node2"])
