"""The store's transitions on their own: encodings, derived flags and what state.json shows."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from srtr.reconciler.clock import FakeClock
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from srtr.store.persist import snapshot
from srtr.store.store import Event, Phase, Store, UserAction

RECIPE = """
name: t
services:
  - name: plain
    command: [sleep, inf]
  - name: probed
    command: [sleep, inf]
    readiness: {tcp: {port: 8000}}
"""
PLAIN, PROBED = "service_plain", "service_probed"


@pytest.fixture
def store() -> Store:
    _, desired = plan_text_source(textwrap.dedent(RECIPE), "recipe.yaml", local_allocation(1))
    return Store(desired, FakeClock())


def events(store: Store) -> list[Event]:
    seen: list[Event] = []
    store.subscribe_events(seen.append)
    return seen


def row(store: Store, name: str) -> dict[str, Any]:
    doc = snapshot(store, backend="fake", controller_pid=1)
    return next(i for i in doc["instances"] if i["name"] == name)


def test_a_launched_instance_without_probe_is_alive_and_ready(store: Store) -> None:
    assert store.launching(PLAIN, log_offset=0) == 0
    store.launched(PLAIN, pid=42, identity=None)
    status = store.status[PLAIN]
    assert (status.phase, status.alive, status.ready, status.exited) == (
        Phase.RUNNING,
        True,
        True,
        False,
    )
    assert store.alive() == [PLAIN]


def test_a_failed_launch_is_an_ended_attempt_shown_as_starting(store: Store) -> None:
    seen = events(store)
    store.launching(PLAIN, log_offset=0)
    store.launch_failed(PLAIN, "no such file: sleep")
    status = store.status[PLAIN]
    assert not status.alive and status.exited and not status.ready
    assert (status.exit_code, status.launch_error) == (127, "no such file: sleep")
    assert [(e.reason, e.message) for e in seen] == [("LaunchFailed", "no such file: sleep")]
    shown = row(store, PLAIN)
    assert (shown["phase"], shown["ready"], shown["exit_code"]) == ("Starting", False, 127)
    store.finished(PLAIN, Phase.FAILED)  # what its restart policy decides next
    assert not status.exited and row(store, PLAIN)["phase"] == "Failed"


def test_an_exit_ends_liveness_and_ready_stays_until_the_next_launch(store: Store) -> None:
    store.launching(PROBED, log_offset=0)
    store.launched(PROBED, pid=42, identity=None)
    assert store.status[PROBED].alive and not store.status[PROBED].ready
    store.probe_passed(PROBED)
    assert store.status[PROBED].ready and row(store, PROBED)["phase"] == "Ready"
    assert store.exited(PROBED, attempt=0, exit_code=1, signal=None)
    status = store.status[PROBED]
    assert not status.alive and status.exited
    assert status.ready and row(store, PROBED)["ready"] is True  # state.json's meaning
    assert status.conditions["Ready"].status == "False"  # not ready now
    store.backing_off(
        PROBED, start_at=1.0, delay=1.0, backoff_index=1, restarts=0, window_start=0.0, code=1
    )
    assert (row(store, PROBED)["phase"], row(store, PROBED)["ready"]) == ("BackOff", True)
    store.launching(PROBED, log_offset=0)
    assert not status.ready and not status.alive


def test_a_report_about_an_older_attempt_changes_nothing(store: Store) -> None:
    store.launching(PLAIN, log_offset=0)
    store.launched(PLAIN, pid=42, identity=None)
    assert not store.exited(PLAIN, attempt=-1, exit_code=0, signal=None)
    assert not store.started(PLAIN, attempt=3, step="1.2")
    assert store.status[PLAIN].alive and store.status[PLAIN].step is None


def test_an_exit_reported_during_launch_leaves_it_not_alive(store: Store) -> None:
    store.launching(PLAIN, log_offset=0)
    assert store.exited(PLAIN, attempt=0, exit_code=0, signal=None)
    store.launched(PLAIN, pid=42, identity=None)
    status = store.status[PLAIN]
    assert status.phase is Phase.RUNNING and not status.alive and status.exited


def test_a_user_request_is_typed_and_recorded(store: Store) -> None:
    seen = events(store)
    store.request(PLAIN, UserAction.STOP)
    assert store.status[PLAIN].user_action is UserAction.STOP
    assert [e.reason for e in seen] == ["StopRequested"]


def test_restored_instances_are_alive_only_once_adopted(store: Store) -> None:
    record = {"name": PROBED, "phase": "Starting", "attempt": 2, "ready": False, "restarts": 2}
    assert store.restored(PROBED, record)
    status = store.status[PROBED]
    assert not status.alive and status.attempt == 2
    assert store.adopted(PROBED, {"pid": 42, "start": 7})  # not ready yet: probe it again
    assert status.alive and status.phase is Phase.STARTING
    plain = {"name": PLAIN, "phase": "Running", "attempt": 0, "ready": True}
    assert store.restored(PLAIN, plain)
    assert store.status[PLAIN].ready
    store.gone(PLAIN)
    assert store.status[PLAIN].exited and store.status[PLAIN].exit_code is None


def test_every_way_of_coming_alive_is_counted(store: Store) -> None:
    """The teardown's memo of who is alive is exact only while `came_alive` is unchanged:
    a launch and an adoption each count, a restore or an exit does not."""
    store.launching(PLAIN, log_offset=0)
    assert store.came_alive == 0
    store.launched(PLAIN, pid=42, identity=None)
    assert store.came_alive == 1
    store.exited(PLAIN, attempt=0, exit_code=0, signal=None)
    record = {"name": PROBED, "phase": "Running", "attempt": 0, "ready": True}
    store.restored(PROBED, record)
    assert store.came_alive == 1
    store.adopted(PROBED, {"pid": 43, "start": 7})
    assert store.came_alive == 2 and store.status[PROBED].alive


def test_a_stage_gate_is_open_from_its_start_until_it_passes(store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    first, _ = store.desired.stages
    assert store.gate_opened_at(first.name) is None  # not begun
    clock.advance(3)
    store.launch_stage(1, first, first.instances)
    assert store.gate_opened_at(first.name) == clock.now()
    store.stage_passed(1, first.name)
    assert store.gate_opened_at(first.name) is None  # passed: the gate is behind it


def test_adoption_restarts_the_clock_of_stages_still_open(store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    first, second = store.desired.stages
    clock.advance(60)
    store.restore_job({"phase": "Launching", "passed_stages": [first.name], "stage": 1})
    assert store.gate_opened_at(first.name) is None
    assert store.gate_opened_at(second.name) == clock.now()  # deadlines count from adoption
