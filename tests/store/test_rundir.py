"""The run dir's contract (srtr.store.rundir): the model matches what the writer writes,
the reader is tolerant as its callers need, and the restart marker reads back as written."""

from __future__ import annotations

import json
import os
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from srtr.reconciler.clock import FakeClock
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from srtr.store import rundir
from srtr.store.persist import event_doc, snapshot
from srtr.store.store import Event, EventType, Store

RECIPE = """
name: t
services:
  - name: pool
    nodes: 2
    command: [sleep, inf]
  - name: rider
    placement: {pool: pool}
    command: [sleep, inf]
    readiness: {tcp: {port: 8000}}
"""


@pytest.fixture
def store() -> Store:
    _, desired = plan_text_source(textwrap.dedent(RECIPE), "recipe.yaml", local_allocation(2))
    return Store(desired, FakeClock())


def test_the_writer_writes_exactly_the_modelled_fields_in_order(store: Store) -> None:
    doc = snapshot(store, backend="local", controller_pid=1)
    assert list(doc) == list(rundir.StateDoc.__annotations__)
    # The runner adds the NotRequired keys (control, recipe_path, ...) after the snapshot.
    job_keys = rundir.JobDoc.__annotations__.items()
    assert list(doc["job"]) == [k for k, v in job_keys if "NotRequired[" not in str(v)]
    for record in doc["instances"]:
        assert list(record) == list(rundir.InstanceDoc.__annotations__)
    assert list(doc["nodes"][0]) == list(rundir.NodeDoc.__annotations__)
    pool_keys = rundir.PoolDoc.__annotations__.items()  # autoscale: autoscaled pools only
    assert list(doc["pools"][0]) == [k for k, v in pool_keys if "NotRequired[" not in str(v)]
    event = event_doc(Event(1.5, EventType.WARNING, "Exited", "job", "boom", 2))
    assert list(event) == list(rundir.EventDoc.__annotations__)
    assert event["type"] == "Warning"


def write(run_dir: Path, text: str) -> None:
    run_dir.mkdir(exist_ok=True)
    (run_dir / rundir.STATE_FILE).write_text(text)


def test_read_state_tells_missing_torn_and_foreign_files_apart(tmp_path: Path) -> None:
    with pytest.raises(rundir.StateFileError) as missing:
        rundir.read_state(tmp_path)
    assert missing.value.missing and not missing.value.foreign
    write(tmp_path, '{"job": {"na')
    with pytest.raises(rundir.StateFileError) as torn:
        rundir.read_state(tmp_path)
    assert not torn.value.missing and not torn.value.foreign
    for foreign in ("[1, 2]", '{"jobs": {}}', '{"job": 3}'):
        write(tmp_path, foreign)
        with pytest.raises(rundir.StateFileError) as error:
            rundir.read_state(tmp_path)
        assert error.value.foreign and str(error.value) == "not an srtr state file"


def test_a_run_state_knows_whether_its_job_has_ended(tmp_path: Path) -> None:
    job = {"name": "t", "phase": "Running", "controller_pid": os.getpid()}
    write(tmp_path, json.dumps({"job": job}))
    state = rundir.read_state(tmp_path)
    assert not state.ended and state.instances == []
    write(tmp_path, json.dumps({"job": {**job, "phase": "Failed"}}))
    assert rundir.read_state(tmp_path).ended
    write(tmp_path, json.dumps({"job": {**job, "controller_pid": None}}))
    assert rundir.read_state(tmp_path).controller_pid is None


def beat(tmp_path: Path, **doc: object) -> rundir.Heartbeat | None:
    (tmp_path / rundir.HEARTBEAT_FILE).write_text(json.dumps(doc))
    return rundir.read_heartbeat(tmp_path)


def test_a_heartbeat_is_fresh_until_it_is_stale_or_says_stopped(tmp_path: Path) -> None:
    """Liveness is the heartbeat's age, never a pid: a beat from a pid that does not exist
    here (another host's) is fresh; one older than HEARTBEAT_STALE is not, whatever pid."""
    now = 1_000_000.0
    assert rundir.read_heartbeat(tmp_path) is None
    elsewhere = beat(tmp_path, ts=now - 1, period=1.0, host="node3", machine="m", pid=2**22 + 1)
    assert elsewhere is not None and elsewhere.fresh(now) and elsewhere.host == "node3"
    assert not elsewhere.same_machine()  # so its pid means nothing here
    stale = beat(tmp_path, ts=now - rundir.HEARTBEAT_STALE - 1, period=1.0, pid=os.getpid())
    assert stale is not None and not stale.fresh(now)
    assert stale.age(now) == pytest.approx(rundir.HEARTBEAT_STALE + 1)
    last = beat(tmp_path, ts=now, period=1.0, pid=os.getpid(), stopped=True)
    assert last is not None and not last.fresh(now)
    ahead = beat(tmp_path, ts=now + 3, period=1.0)  # a host whose clock is a little ahead
    assert ahead is not None and ahead.age(now) == 0 and ahead.fresh(now)
    here = beat(tmp_path, ts=now, machine=rundir.machine_id(), pid=os.getpid())
    assert here is not None and here.same_machine() and here.pid == os.getpid()
    (tmp_path / rundir.HEARTBEAT_FILE).write_text('{"ts": 1')  # torn: no beat
    assert rundir.read_heartbeat(tmp_path) is None


@pytest.mark.parametrize("pid", [None, 0, -1, "12", 2**22 + 1])
def test_pid_alive_is_false_for_what_cannot_be_a_live_controller(pid: object) -> None:
    assert not rundir.pid_alive(pid)


def test_pid_alive_sees_this_process() -> None:
    assert rundir.pid_alive(os.getpid())


def test_a_torn_events_line_is_not_an_event() -> None:
    assert rundir.parse_event('{"ts": 1, "reason": "Launched"}') == {"ts": 1, "reason": "Launched"}
    assert rundir.parse_event('{"ts": 1, "rea') is None
    assert rundir.parse_event("[1]") is None


def test_the_restart_marker_reads_back_as_written() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    line = rundir.restart_marker(instance="svc_node2", attempt=3, node="node2", at=at)
    assert (
        line
        == "==== srtr: svc_node2 attempt 3 starting on node2 at 2026-01-02T03:04:05.678901Z ====\n"
    )
    assert line.encode().startswith(rundir.MARKER_PREFIX)
    assert rundir.parse_restart_marker(line) == rundir.RestartMarker(
        "svc_node2", 3, "node2", "2026-01-02T03:04:05.678901Z"
    )
    assert rundir.parse_restart_marker("==== srtr: cannot start 'x' ====") is None
