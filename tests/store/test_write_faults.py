"""The writers of the run dir on real faults, without a job: a file size limit on this
process (RLIMIT_FSIZE, which needs no privileges) and directories removed under them.

The whole job under the same faults is tests/e2e/local/test_storage_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
from collections.abc import Callable
from pathlib import Path

from srtr.controllers import exporter
from srtr.runtime.targets_file import WRITE_RETRY, TargetsFile
from srtr.store.persist import AppendFile, EventLog
from tests.support.controller_harness import Harness, one_service_store


def _with_fsize_limit(limit: int, body: Callable[[], None]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        body()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_an_event_line_is_never_torn_and_waits_in_order(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    store = one_service_store()
    log = EventLog(path, store.write_faults, limit=5)
    store.subscribe_events(log)
    store.record("job", "Tick", "0")
    size = path.stat().st_size

    def full() -> None:
        store.record("job", "Tick", "1" * 4000)  # crosses the limit: written in part, cut back
        for n in range(2, 9):
            store.record("job", "Tick", str(n))

    _with_fsize_limit(size + 1000, full)
    assert path.stat().st_size == size  # nothing torn: the partial line was cut back
    assert len(log.pending) == 5 and log.dropped == 4  # bounded; the rest are counted
    assert log.flush()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    told = [(e["reason"], e["message"][:1]) for e in lines]
    # In order: what waited (with the fault, reported once, where it happened), then the
    # count of what did not fit, then the recovery.
    assert told[:6] == [
        ("Tick", "0"),
        ("Tick", "1"),
        ("WriteFailing", "c"),
        ("Tick", "2"),
        ("Tick", "3"),
        ("Tick", "4"),
    ]
    assert "EFBIG" in lines[2]["message"]
    assert [reason for reason, _ in told[6:]] == ["EventsDropped", "WriteRecovered"]
    assert lines[6]["message"].startswith("4 event(s)")
    assert store.write_faults.failing == {}


def test_a_turn_of_more_events_than_memory_keeps_writes_them_all(tmp_path: Path) -> None:
    """The runtime adds a loop turn's events and flushes once at its end; a turn that
    records more than the limit (a teardown's batch of exits) must not drop any while the
    file can be written."""
    path = tmp_path / "events.jsonl"
    store = one_service_store()
    log = EventLog(path, store.write_faults, limit=5)
    store.subscribe_events(log.add)
    for n in range(12):
        store.record("job", "Tick", str(n))
    assert log.flush()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["reason"], e["message"]) for e in lines] == [("Tick", str(n)) for n in range(12)]
    assert log.dropped == 0


def test_an_append_file_follows_its_path_when_it_is_deleted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def restore() -> bool:
        run_dir.mkdir(exist_ok=True)
        return True

    file = AppendFile(run_dir / "srtr.log", restore)
    file.write(b"one\n")
    shutil.rmtree(run_dir)
    file.write(b"two\n")  # not into the deleted file: the path again, its dir recreated
    assert (run_dir / "srtr.log").read_text() == "two\n"
    file.close()


def test_the_targets_file_is_retried_until_it_can_be_written(tmp_path: Path) -> None:
    recipe = """
    name: job1
    services:
      - name: app
        command: [sleep, inf]
        metrics: {port: 9000}
    """
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    async def body() -> None:
        h = Harness(recipe, run_dir)
        TargetsFile(h.ctx).attach()
        exporter.start(h.ctx)
        shutil.rmtree(run_dir)  # vanished, and nobody recreates it (no runtime here)
        await h.settle()
        assert h.phase("service_app") == "Running"  # its log is /dev/null: it still runs
        reasons = [(e.reason, e.message.split(":")[0]) for e in h.events if "Write" in e.reason]
        assert ("WriteFailing", f"cannot write {exporter.TARGETS_FILE}") in reasons
        run_dir.mkdir()
        await h.advance(WRITE_RETRY)
        listed = json.loads((run_dir / exporter.TARGETS_FILE).read_text())
        assert [t["labels"]["instance"] for t in listed] == ["service_app"]
        assert h.events[-1].reason == "WriteRecovered"
        assert exporter.TARGETS_FILE in h.events[-1].message

    asyncio.run(body())
