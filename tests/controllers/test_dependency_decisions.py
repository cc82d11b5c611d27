"""depends_on's pure decisions on the plan of examples/depends-on.yaml: which stages begin
when, what a dependent waits for, an init service's failure, and which dependents restart
with their dependency. Plain values: no store, backend or loop."""

from __future__ import annotations

from pathlib import Path

from srtr.controllers.decisions import exited_unready, stage_done
from srtr.controllers.dependency_decisions import (
    GraphStep,
    holds,
    init_failure,
    start_step,
    to_restart,
)
from srtr.resources.objects import DesiredState
from srtr.resources.planning import plan_file
from srtr.store.status import InstanceStatus, Phase, UserAction

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "depends-on.yaml"
WORKERS = ("service_workers_node1", "service_workers_node2")


def plan() -> DesiredState:
    return plan_file(EXAMPLE)[1]


def fresh(state: DesiredState) -> dict[str, InstanceStatus]:
    return {s.name: InstanceStatus() for s in state.instances}


def up(status: InstanceStatus, *, at: float = 1.0) -> None:
    """Launched at `at` and ready."""
    status.activated = True
    status.attempt = 0
    status.phase = Phase.READY
    status.ready_attempt = 0
    status.started_at = at


def succeeded(status: InstanceStatus, code: int = 0) -> None:
    up(status)
    status.exited_attempt = 0
    status.exit_code = code
    status.phase = Phase.SUCCEEDED if code == 0 else Phase.FAILED


def number(state: DesiredState, stage: str) -> int:
    """A stage's number in the whole launch order (the workers' setup stage comes first)."""
    return next(n for n, s in enumerate(state.stages, 1) if s.name == stage)


def step(state: DesiredState, statuses: dict[str, InstanceStatus], passed: set[str]) -> GraphStep:
    specs = {s.name: s for s in state.instances}
    return start_step(state.stages, state.dependencies, specs, statuses, passed)


def test_only_the_init_service_begins_and_the_dependents_say_what_they_wait_for() -> None:
    state = plan()
    first = step(state, fresh(state), set())
    # prepare has no depends_on: it is the chain's, and the chain's first stage
    assert first.chain.started is not None
    assert first.chain.started[1].name == "after_frontend/prepare"
    assert first.chain.activate == ("service_prepare",)
    assert first.started == () and first.activate == ()
    assert first.waiting == {
        "workers": "scheduler ready",
        "scheduler": "prepare completed",
        "client": "workers ready",
    }
    assert not first.all_up


def test_a_clean_exit_of_the_init_service_passes_it_and_starts_its_dependent() -> None:
    state = plan()
    statuses = fresh(state)
    succeeded(statuses["service_prepare"])
    prepare = state.instance("service_prepare")
    assert prepare.run_to_completion and stage_done(prepare, statuses["service_prepare"])
    assert not exited_unready(prepare, statuses["service_prepare"])
    now = step(state, statuses, {"after_frontend/prepare"})
    assert now.activate == ("service_scheduler",)
    scheduler = (number(state, "after_frontend/scheduler"), "after_frontend/scheduler")
    assert [(n, stage.name) for n, stage in now.started] == [scheduler]
    assert "scheduler" not in now.waiting and "workers" in now.waiting


def test_workers_declared_first_start_once_the_scheduler_is_ready() -> None:
    state = plan()
    statuses = fresh(state)
    succeeded(statuses["service_prepare"])
    up(statuses["service_scheduler"])
    passed = {"after_frontend/prepare"}
    now = step(state, statuses, passed)
    assert (number(state, "after_frontend/scheduler"), "after_frontend/scheduler") in now.passed
    # each worker node's setup first, then the workers
    setups = {"setup_workers_node1", "setup_workers_node2"}
    assert set(now.activate) == setups
    for name in setups:
        succeeded(statuses[name])
    passed |= {"after_frontend/scheduler", "after_frontend/workers.setup"}
    assert set(step(state, statuses, passed).activate) == set(WORKERS)
    statuses["service_scheduler"].phase = Phase.STARTING  # launched, not ready: started only
    statuses["service_scheduler"].ready_attempt = None
    assert step(state, statuses, passed).waiting["workers"] == "scheduler ready"


def test_every_stage_up_is_all_up() -> None:
    state = plan()
    statuses = fresh(state)
    for name, status in statuses.items():
        if state.instance(name).kind.value == "setup":
            succeeded(status)  # a per-node setup is up once it exited 0
        else:
            up(status)
    assert step(state, statuses, set()).all_up


def test_an_init_service_that_failed_fails_the_job_naming_its_log() -> None:
    state = plan()
    statuses = fresh(state)
    specs = {s.name: s for s in state.instances}
    assert init_failure(state.dependencies, specs, statuses) is None
    succeeded(statuses["service_prepare"], code=3)
    why = init_failure(state.dependencies, specs, statuses)
    assert why == (
        "services[prepare] exited with code 3 on node4; it is an init service "
        "(services[scheduler] waits for it to complete); see logs/service_prepare.out"
    )


def test_conditions() -> None:
    state = plan()
    statuses = fresh(state)
    on_scheduler = next(e for e in state.dependencies if e.on == "scheduler")
    assert not holds(on_scheduler, statuses)
    up(statuses["service_scheduler"])
    assert holds(on_scheduler, statuses)
    statuses["service_scheduler"].exited_attempt = 0  # exited: no longer ready
    assert not holds(on_scheduler, statuses)


def running(state: DesiredState) -> dict[str, InstanceStatus]:
    statuses = fresh(state)
    succeeded(statuses["service_prepare"])
    up(statuses["service_scheduler"], at=1.0)
    for worker in WORKERS:
        up(statuses[worker], at=2.0)
    return statuses


def test_a_scheduler_that_is_down_restarts_its_workers_once() -> None:
    state = plan()
    statuses = running(state)
    assert to_restart(state.dependencies, statuses) == []
    scheduler = statuses["service_scheduler"]
    scheduler.exited_attempt = 0
    scheduler.phase = Phase.BACKOFF  # its restart policy brings it back
    assert to_restart(state.dependencies, statuses) == [(w, "scheduler") for w in WORKERS]
    statuses[WORKERS[0]].user_action = UserAction.RESTART  # asked already: not again
    assert to_restart(state.dependencies, statuses) == [(WORKERS[1], "scheduler")]


def test_workers_that_exited_with_their_scheduler_restart_too() -> None:
    state = plan()
    statuses = running(state)
    for worker in WORKERS:  # a Dask worker exits 0 when its scheduler goes away
        statuses[worker].exited_attempt = 0
        statuses[worker].phase = Phase.SUCCEEDED
    up(statuses["service_scheduler"], at=5.0)  # already back, a newer attempt
    statuses["service_scheduler"].attempt = 1
    statuses["service_scheduler"].ready_attempt = 1
    assert to_restart(state.dependencies, statuses) == [(w, "scheduler") for w in WORKERS]


def test_workers_waiting_for_their_launch_or_launched_after_it_are_left_alone() -> None:
    state = plan()
    statuses = running(state)
    scheduler = statuses["service_scheduler"]
    scheduler.attempt = scheduler.ready_attempt = 1
    scheduler.started_at = 1.5  # restarted, but before the workers' attempts began
    assert to_restart(state.dependencies, statuses) == []
    statuses[WORKERS[0]].phase = Phase.BACKOFF  # waiting for its launch
    scheduler.started_at = 3.0
    assert to_restart(state.dependencies, statuses) == [(WORKERS[1], "scheduler")]


def test_a_dependency_without_restart_restarts_nothing() -> None:
    state = plan()
    statuses = running(state)
    up(statuses["service_client"], at=3.0)
    for worker in WORKERS:  # the client depends on the workers, restart: false
        up(statuses[worker], at=4.0)
    assert to_restart(state.dependencies, statuses) == []
