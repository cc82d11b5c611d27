"""The state follower (what the TUI polls with): a big job's changes are read from the delta
log's new lines only and applied to a copy that shares the records no line changed; a
compaction's new snapshot is not read (the follower read its changes in the old log); a
state.json with changes it did not read (a small job's write, the job's last write, a
follower two compactions behind) is read whole; a torn last line waits. Always the same
document `read_state` reads."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from srtr.store.persist import head
from srtr.store.rundir import read_state
from srtr.store.state_delta import DELTA_FILE
from srtr.store.state_follow import StateFollower
from srtr.store.state_log import StateWriter
from tests.support.big_state import JOB
from tests.support.controller_harness import Harness

WEB = "service_web"
# big_state's job, with a web server that restarts for as long as a test wants.
RESTARTING = JOB.replace(
    "restart: {policy: always, backoff_seconds: 50}",
    "restart: {policy: always, backoff_seconds: 1, max_restarts: 1000, window_seconds: 1000}",
)


def _instances(state: Any) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in state.doc["instances"]}


def test_a_big_jobs_changes_are_read_from_the_new_lines_and_share_the_rest(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1)  # past the limit at once: a big job

        def write() -> None:
            writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)

        await h.settle()
        write()
        follower = StateFollower(tmp_path)
        first = follower.read()
        assert first is not None and first.doc == read_state(tmp_path).doc
        assert follower.changed is None  # read whole: anything may have changed
        assert follower.read() is None  # nothing new
        before = _instances(first)

        h.exit("service_web", 3)
        await h.settle()
        write()
        snapshot = (tmp_path / "state.json").stat()
        second = follower.read()
        assert second is not None and second.doc == read_state(tmp_path).doc
        assert (tmp_path / "state.json").stat().st_ino == snapshot.st_ino  # only the log grew
        after = _instances(second)
        # The instances it says changed are exactly those whose records differ.
        assert follower.changed == {n for n in after if after[n] != before[n]}
        assert "service_web" in follower.changed
        assert after["service_web"] is not before["service_web"]
        assert after["service_web"]["phase"] != before["service_web"]["phase"]
        unchanged = [n for n in before if before[n] == after[n]]
        assert unchanged and all(after[n] is before[n] for n in unchanged)
        assert before["service_web"]["phase"] == "Running"  # the first document untouched

        # A torn last line waits for its end; the whole line is then applied.
        log = tmp_path / DELTA_FILE
        h.exit("service_shipper_node1", 2)
        await h.settle()
        write()
        text = log.read_bytes()
        last = text[: len(text) - 1].rfind(b"\n") + 1
        log.write_bytes(text[: last + 5])
        assert follower.read() is None
        log.write_bytes(text)
        third = follower.read()
        assert third is not None and third.doc == read_state(tmp_path).doc

        # The job's last write rewrites the snapshot whole: read whole again.
        writer.finish()
        write()
        last_state = follower.read()
        assert last_state is not None and last_state.doc == read_state(tmp_path).doc

    asyncio.run(body())


def test_a_small_jobs_state_json_is_read_whole_at_each_write(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path)  # small: state.json rewritten whole
        await h.settle()
        writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)
        follower = StateFollower(tmp_path)
        assert follower.read() is not None and follower.read() is None
        h.exit("service_web", 3)
        await h.settle()
        writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)
        state = follower.read()
        assert state is not None and state.seq is None
        assert state.doc == read_state(tmp_path).doc
        assert not (tmp_path / DELTA_FILE).exists()

    asyncio.run(body())


def test_no_state_json_yet_is_nothing(tmp_path: Path) -> None:
    assert StateFollower(tmp_path).read() is None


async def _crash_web(h: Harness) -> None:
    """`service_web` exits and, after its backoff, runs again (two changes of its record)."""
    h.exit(WEB, 3)
    await h.settle()
    for _ in range(1000):  # its backoff grows: wait for the next attempt
        await h.advance(1)
        if WEB in h.backend.live:
            return
    raise AssertionError("service_web was not launched again")


def _inode(path: Path) -> int:
    return os.stat(path / "state.json").st_ino


def test_a_compaction_is_followed_from_the_log_without_reading_the_snapshot(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        h = Harness(RESTARTING, tmp_path)
        writer = StateWriter(tmp_path, limit=1)  # a big job: snapshot + log

        def write() -> None:
            writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)

        await h.settle()
        write()
        follower, behind = StateFollower(tmp_path), StateFollower(tmp_path)
        assert follower.read() is not None and behind.read() is not None
        snapshots = [_inode(tmp_path)]
        previous = follower.read() or read_state(tmp_path)
        while len(snapshots) < 4:  # three compactions, each followed from the log
            await _crash_web(h)
            write()
            if _inode(tmp_path) != snapshots[-1]:
                snapshots.append(_inode(tmp_path))
            state = follower.read()
            assert state is not None and state.doc == read_state(tmp_path).doc
            assert follower.whole_reads == 1  # only the first read
            before, after = _instances(previous), _instances(state)
            assert follower.changed == {n for n in after if after[n] != before[n]} == {WEB}
            previous = state
        assert follower.read() is None and follower.unchanged()

        # Two compactions behind, the old log it holds open does not reach the snapshot.
        caught_up = behind.read()
        assert caught_up is not None and caught_up.doc == read_state(tmp_path).doc
        assert behind.whole_reads == 2 and behind.changed is None

        # The job's last write compacts with changes no line holds: read whole.
        h.exit("service_shipper_node1", 2)
        await h.settle()
        writer.finish()
        write()
        last = follower.read()
        assert last is not None and last.doc == read_state(tmp_path).doc
        assert follower.whole_reads == 2

    asyncio.run(body())


def test_a_snapshot_seen_before_the_old_log_is_removed_is_followed_too(tmp_path: Path) -> None:
    """The writer replaces state.json first and removes the old log after: a follower that
    looks in between finds the new snapshot beside the old log, then a new log."""

    async def body() -> None:
        h = Harness(RESTARTING, tmp_path)
        writer = StateWriter(tmp_path, limit=1)

        def write() -> None:
            writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)

        await h.settle()
        write()
        follower = StateFollower(tmp_path)
        assert follower.read() is not None
        log, kept = tmp_path / DELTA_FILE, tmp_path / "old.jsonl"
        first = _inode(tmp_path)
        while _inode(tmp_path) == first:
            if log.exists():
                kept.unlink(missing_ok=True)
                os.link(log, kept)  # the log as the compaction finds it
            await _crash_web(h)
            write()
        os.link(kept, log)  # put back where it was: the removal has not happened yet
        state = follower.read()
        assert state is not None and state.doc == read_state(tmp_path).doc
        assert follower.read() is None and follower.unchanged()
        log.unlink()
        await _crash_web(h)
        write()  # the new log begins
        assert not follower.unchanged()
        state = follower.read()
        assert state is not None and state.doc == read_state(tmp_path).doc
        assert follower.changed == {WEB} and follower.whole_reads == 1

    asyncio.run(body())
