"""The state follower (what the TUI polls with): a big job's changes are read from the delta
log's new lines only and applied to a copy that shares the records no line changed; a
replaced state.json (a compaction, a small job's write) is read whole; a torn last line waits.
Always the same document `read_state` reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from srtr.store.persist import head
from srtr.store.rundir import read_state
from srtr.store.state_delta import DELTA_FILE
from srtr.store.state_follow import StateFollower
from srtr.store.state_log import StateWriter
from tests.support.big_state import JOB
from tests.support.controller_harness import Harness


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
