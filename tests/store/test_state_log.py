"""The state writer and its one reader: state.json whole while small; snapshot + delta log
once big (threshold both ways), torn lines, compaction, the sequence, the guard's mirror.

The reference is always `persist.snapshot` of the same store: whatever the writer wrote, the
reader must give back exactly the document a whole rewrite would have written.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from srtr.runtime import guard
from srtr.store.persist import head, snapshot
from srtr.store.rundir import read_state, read_summary
from srtr.store.state_delta import DELTA_FILE, SUMMARY_FILE, apply_deltas
from srtr.store.state_log import TEARDOWN_PERIOD, StateWriter
from tests.support.controller_harness import Harness

JOB = """
name: t
services:
  - name: train
    command: [train]
    nodes: 3
    stop_grace_seconds: 5
    restart: {policy: on-failure, scope: pool, max_restarts: 5, backoff_seconds: 2}
  - name: shipper
    command: [ship]
    placement: {pool: train}
  - name: web
    command: [serve]
    readiness: {port: 9000, timeout_seconds: 50, interval_seconds: 1}
    restart: {policy: always, backoff_seconds: 1, max_restarts: 1000, window_seconds: 1000}
"""
RANK = "service_train_node2"
WEB = "service_web"


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def _write(h: Harness, writer: StateWriter) -> None:
    writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)


async def _big(tmp_path: Path, **options: Any) -> tuple[Harness, StateWriter]:
    """The job settled and written once (and read back) by a writer in its big-job mode
    (limit 1 byte), summary.json written at every write; `options` for the writer."""
    h = Harness(JOB, tmp_path)
    writer = StateWriter(tmp_path, **({"limit": 1, "summary_period": 0} | options))
    await h.settle()
    _check(h, writer, tmp_path)
    return h, writer


async def _web_failed(h: Harness, writer: StateWriter, run_dir: Path) -> None:
    """WEB exits 3 (the job's first failure); the change written and read back."""
    h.exit(WEB, 3)
    await h.settle()
    _check(h, writer, run_dir)


def _expected(h: Harness) -> Any:
    return json.loads(json.dumps(snapshot(h.store, backend="fake", controller_pid=1)))


def _check(h: Harness, writer: StateWriter, run_dir: Path) -> None:
    _write(h, writer)
    assert read_state(run_dir).doc == _expected(h)


async def _story(h: Harness, writer: StateWriter, run_dir: Path) -> None:
    """A job's life with a write (and a reading) after each step: launch, a probe passing,
    a crash and its backoff, a pool's gang restart, a teardown."""
    await h.settle()
    _check(h, writer, run_dir)
    h.prober.ready.add(WEB)
    await h.advance(1)
    _check(h, writer, run_dir)
    h.exit(WEB, 3)
    await h.settle()
    _check(h, writer, run_dir)
    await h.advance(2)
    _check(h, writer, run_dir)
    h.exit(RANK, 1)
    await h.settle()
    _check(h, writer, run_dir)
    for _ in range(4):
        await h.advance(3)
        _check(h, writer, run_dir)
    h.store.begin_teardown(exit_code=0, reason="test")
    h.ctx.queue.add("teardown")
    await h.advance(10)
    writer.finish()  # a big job's teardown writes its instance records at its end
    _check(h, writer, run_dir)


def test_a_small_job_gets_its_state_json_whole_and_nothing_else(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path)
        await _story(h, writer, tmp_path)
        text = (tmp_path / "state.json").read_text()
        assert text == json.dumps(_expected(h), separators=(",", ":")) + "\n"
        assert not (tmp_path / DELTA_FILE).exists() and not (tmp_path / SUMMARY_FILE).exists()

    run(body())


def test_a_big_job_appends_deltas_that_read_back_as_the_whole_document(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1)  # every job is big
        await h.settle()
        _check(h, writer, tmp_path)  # the first big write is a snapshot
        assert '"seq":1}' in (tmp_path / "state.json").read_text()
        # A delta carries what changed, not the job: one crash is one instance record.
        h.exit("service_shipper_node1", 0)
        await h.settle()
        _check(h, writer, tmp_path)
        log = (tmp_path / DELTA_FILE).read_text()
        delta = json.loads(log.splitlines()[-1])
        assert [i["name"] for i in delta["items"]["instances"]] == ["service_shipper_node1"]
        assert len(log) == writer.written  # summary.json waits for its period
        await _story(h, writer, tmp_path)
        assert writer.seq > 3 and not (tmp_path / DELTA_FILE).exists()  # the last: whole
        assert json.loads((tmp_path / "state.json").read_text())["seq"] == writer.seq

    run(body())


def test_a_changed_job_field_is_that_field_not_the_whole_job(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        await _web_failed(h, writer, tmp_path)  # the job's first failure: its cause
        delta = json.loads((tmp_path / DELTA_FILE).read_text().splitlines()[-1])
        assert "set" not in delta and list(delta["fields"]) == ["job"]
        assert "cause" in delta["fields"]["job"] and "name" not in delta["fields"]["job"]

    run(body())


def test_the_summary_counts_what_the_instances_say(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        await _web_failed(h, writer, tmp_path)
        summary = read_summary(tmp_path)
        assert summary is not None and summary["instance_count"] == 7
        by_service = {s["service"]: s for s in summary["services"]}
        assert by_service["train"]["phases"] == {"Running": 3} and by_service["train"]["ready"] == 3
        assert by_service["web"]["phases"] == {"BackOff": 1}
        assert [i["name"] for i in summary["not_desired"]] == [WEB]
        assert summary["pools"][0]["hosts"] == "node[1-3]" and "nodes" not in summary["pools"][0]

    run(body())


def test_the_threshold_both_ways(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        await _web_failed(h, writer, tmp_path)
        assert (tmp_path / DELTA_FILE).exists() and (tmp_path / SUMMARY_FILE).exists()
        writer.limit = 1 << 20  # the job is small again (a live edit shrank it)
        writer.invalidate()
        await h.advance(2)
        _check(h, writer, tmp_path)
        assert "seq" not in json.loads((tmp_path / "state.json").read_text())
        assert not (tmp_path / DELTA_FILE).exists() and not (tmp_path / SUMMARY_FILE).exists()

    run(body())


def test_a_new_writer_removes_an_old_jobs_log_and_summary(tmp_path: Path) -> None:
    (tmp_path / DELTA_FILE).write_text('{"seq":2,"set":{"job":{"phase":"Failed"}}}\n')
    (tmp_path / SUMMARY_FILE).write_text('{"job":{}}\n')

    async def body() -> None:
        h = Harness(JOB, tmp_path)
        await h.settle()
        _check(h, StateWriter(tmp_path), tmp_path)
        assert not (tmp_path / DELTA_FILE).exists() and read_summary(tmp_path) is None

    run(body())


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        await _web_failed(h, writer, tmp_path)
        good = read_state(tmp_path).doc
        log = tmp_path / DELTA_FILE
        log.write_text(log.read_text() + '{"seq":99,"set":{"job":{"phase":"Fail')  # cut short
        assert read_state(tmp_path).doc == good

    run(body())


def test_the_log_is_compacted_once_it_outgrows_the_snapshot(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1)
        h.prober.ready.add(WEB)
        await h.advance(1)
        _check(h, writer, tmp_path)
        compacted = False
        log, kept = tmp_path / DELTA_FILE, tmp_path / "kept.jsonl"
        for _ in range(40):
            h.exit(WEB, 3)
            for _ in range(100):  # its backoff grows: wait for the next attempt
                await h.advance(1)
                if WEB in h.backend.live:
                    break
            kept.unlink(missing_ok=True)
            if log.exists():
                os.link(log, kept)  # what a reader that holds the log open still reads
            _check(h, writer, tmp_path)
            assert writer.compacted == (not log.exists())  # what spaces the next write out
            if not log.exists():
                compacted = True
                break
            *before, _last = log.read_text().splitlines(keepends=True)
            snapshot_size = (tmp_path / "state.json").stat().st_size
            assert sum(map(len, before)) <= snapshot_size  # past it by one line at most
        assert compacted
        doc = json.loads((tmp_path / "state.json").read_text())
        assert doc["seq"] == writer.seq  # the snapshot says which change it includes
        # The line that made the log outgrow the snapshot was written first, and the
        # snapshot includes no more: the old log, read to its end, is the snapshot.
        assert json.loads(kept.read_text().splitlines()[-1])["seq"] == doc["seq"]

    run(body())


def test_the_log_is_synced_after_its_period_not_compacted(tmp_path: Path) -> None:
    now = [0.0]
    synced: list[int] = []

    async def body() -> None:
        h, writer = await _big(tmp_path, sync_period=60, clock=lambda: now[0])
        sync = writer.log.sync
        writer.log.sync = lambda: synced.append(len((tmp_path / DELTA_FILE).read_text()))  # type: ignore[method-assign]
        await _web_failed(h, writer, tmp_path)
        assert (tmp_path / DELTA_FILE).exists() and not synced
        now[0] = 61
        await h.advance(2)
        _check(h, writer, tmp_path)
        # A restart after an idle hour costs its line, not a snapshot of the whole job.
        log = (tmp_path / DELTA_FILE).read_text()
        assert len(log.splitlines()) == 2 and synced == [len(log)]
        writer.log.sync = sync  # type: ignore[method-assign]

    run(body())


async def _relaunched(h: Harness) -> None:
    """Until WEB's next attempt runs (its backoff grows)."""
    for _ in range(100):
        await h.advance(1)
        if WEB in h.backend.live:
            return
    raise AssertionError("not relaunched")


def test_summary_json_waits_for_its_period_and_a_change_undone_by_then_costs_nothing(
    tmp_path: Path,
) -> None:
    now = [0.0]

    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1, summary_period=2, clock=lambda: now[0])
        await h.settle()
        _write(h, writer)
        h.exit(WEB, 3)  # the job's first failure: its cause stays in the summary
        await _relaunched(h)
        _write(h, writer)
        first = (tmp_path / SUMMARY_FILE).read_text()
        assert writer.due_in() == 2 and '"cause":null' in first
        now[0] = 2
        _write(h, writer)  # nothing else changed: the write that was due
        first = (tmp_path / SUMMARY_FILE).read_text()
        assert '"cause":{' in first and writer.due_in() is None
        h.exit(WEB, 3)  # a restart that is over within the period
        await h.settle()
        _write(h, writer)
        assert writer.due_in() == 2
        await _relaunched(h)  # Starting again, as the summary says
        now[0] = 4
        _write(h, writer)
        assert (tmp_path / SUMMARY_FILE).read_text() == first and writer.due_in() is None
        h.exit(RANK, 1)  # the pool restarts after its backoff: a change that lasts
        await h.settle()
        _write(h, writer)
        assert writer.due_in() == 2 and (tmp_path / SUMMARY_FILE).read_text() == first
        now[0] = 6
        _write(h, writer)
        summary = read_summary(tmp_path)
        assert summary is not None and summary["seq"] == writer.seq
        by_service = {s["service"]: s for s in summary["services"]}
        assert by_service["train"]["phases"] != {"Running": 3}
        assert writer.due_in() is None

    run(body())


def test_a_teardown_writes_the_instance_records_at_its_end_or_after_its_period(
    tmp_path: Path,
) -> None:
    now = [0.0]

    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1, clock=lambda: now[0])
        await h.settle()
        _check(h, writer, tmp_path)
        before = read_state(tmp_path).doc["instances"]
        h.store.begin_teardown(exit_code=0, reason="test")
        h.store.terminating(RANK, at=h.store.clock.now())  # what the teardown sends first
        _write(h, writer)
        doc = read_state(tmp_path).doc
        assert doc["job"]["phase"] == "TearingDown" and doc["instances"] == before
        now[0] = TEARDOWN_PERIOD
        _check(h, writer, tmp_path)  # the period is over: every record as it is now
        h.ctx.queue.add("teardown")
        await h.advance(10)
        writer.finish()
        _check(h, writer, tmp_path)
        assert not (tmp_path / DELTA_FILE).exists()

    run(body())


def test_lines_the_snapshot_includes_are_skipped_and_a_gap_ends_the_reading() -> None:
    doc: dict[str, Any] = {"job": {"phase": "Running"}, "instances": [{"name": "a", "pid": 1}]}
    lines = [
        '{"seq":3,"set":{"job":{"phase":"Old"}}}',  # before the snapshot (seq 4)
        '{"seq":5,"items":{"instances":[{"name":"a","pid":2},{"name":"b","pid":3}]}}',
        '{"seq":7,"set":{"job":{"phase":"Failed"}}}',  # 6 is missing
    ]
    assert apply_deltas(doc, 4, lines) == 5
    assert doc == {
        "job": {"phase": "Running"},
        "instances": [{"name": "a", "pid": 2}, {"name": "b", "pid": 3}],
    }


def test_the_guards_mirror_reads_a_big_job_as_the_run_dir_does(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1)
        mirror = guard.StateMirror()
        try:
            await h.settle()
            _write(h, writer)
            writer.attach(mirror)  # late: it gets the snapshot and the lines so far
            h.exit(WEB, 3)
            await h.settle()
            _write(h, writer)
            h.exit(RANK, 1)
            await h.settle()
            _write(h, writer)
            mirrored = guard._read_mirror(mirror.fd, tmp_path)
            assert mirrored is not None and mirrored.doc == _expected(h)
            pids = {i["name"]: i["identity"] for i in mirrored.instances}
            assert pids == {n: h.store.status[n].identity for n in h.store.specs}
        finally:
            mirror.close()

    run(body())


def test_the_last_write_leaves_a_whole_current_snapshot(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        await _web_failed(h, writer, tmp_path)
        assert (tmp_path / DELTA_FILE).exists()
        writer.finish()
        _write(h, writer)  # nothing changed since: the snapshot is rewritten all the same
        assert not (tmp_path / DELTA_FILE).exists()
        doc = json.loads((tmp_path / "state.json").read_text())
        assert doc.pop("seq") == writer.seq and doc == _expected(h)

    run(body())


def test_the_guard_without_a_mirror_sees_a_change_that_only_the_log_has(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        last = guard._LastState(tmp_path)
        assert last.refresh() is not None
        await _web_failed(h, writer, tmp_path)  # a delta: state.json itself is unchanged
        state = last.refresh()
        assert state is not None and state.doc == _expected(h)

    run(body())


def test_after_a_failed_write_the_next_one_compacts_what_both_held(tmp_path: Path) -> None:
    async def body() -> None:
        h, writer = await _big(tmp_path)
        seq = writer.seq
        full = writer.log.write

        def full_disk(data: bytes) -> None:
            raise OSError(28, "No space left on device")

        writer.log.write = full_disk  # type: ignore[method-assign]
        h.exit(WEB, 3)
        await h.settle()
        with pytest.raises(OSError):
            _write(h, writer)
        assert writer.seq == seq and read_state(tmp_path).doc != _expected(h)
        writer.log.write = full  # type: ignore[method-assign]
        h.exit(RANK, 1)
        await h.settle()
        _check(h, writer, tmp_path)  # both changes, though the first one's touch was taken
        assert not (tmp_path / DELTA_FILE).exists()  # a new snapshot, not a delta

    run(body())
