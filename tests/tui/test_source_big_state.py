"""The TUI's reader on a big job's run dir: a change that only the delta log holds (state.json
left as it was) is a new state on the next poll, and no change is no state; a change the
read pause holds back is read at once when the job holds still."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from srtr.store.persist import head
from srtr.store.state_log import StateWriter
from srtr.tui import frames
from srtr.tui.source import RunSource
from tests.support.big_state import JOB
from tests.support.controller_harness import Harness


def _phase(state, name: str) -> str:  # type: ignore[no-untyped-def]
    return next(i["phase"] for i in state.instances if i["name"] == name)


def test_a_change_only_the_delta_log_holds_is_seen(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1)  # every write past the limit: big-job mode

        def write() -> None:
            writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)

        await h.settle()
        write()
        source = RunSource(tmp_path)
        first = source.poll().state
        assert first is not None and _phase(first, "service_web") == "Running"
        assert source.poll().state is None  # nothing changed
        assert source.unchanged()  # and a look (stats only) says so
        snapshot = os.stat(tmp_path / "state.json")
        h.exit("service_web", 3)
        await h.settle()
        write()
        after = os.stat(tmp_path / "state.json")
        assert (after.st_ino, after.st_mtime_ns) == (snapshot.st_ino, snapshot.st_mtime_ns)
        assert not source.unchanged()  # a line appended to the delta log is a change
        changed = source.poll().state
        assert changed is not None and _phase(changed, "service_web") != "Running"

    asyncio.run(body())


def test_a_reader_that_keeps_the_last_events_parses_no_more_than_those(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text(
        "".join(
            f'{{"ts": {n}, "type": "Normal", "reason": "Launched", "object": "i{n}"}}\n'
            for n in range(50)
        )
    )
    source = RunSource(tmp_path)
    source.events_kept = 5
    assert [e["object"] for e in source.poll().events] == [f"i{n}" for n in range(45, 50)]
    with (tmp_path / "events.jsonl").open("a") as handle:
        handle.write('{"ts": 50, "type": "Normal", "reason": "Launched", "object": "i50"}\n')
    assert [e["object"] for e in source.poll().events] == ["i50"]  # then every new one


def test_a_look_finds_each_kind_of_change_a_poll_would_read(tmp_path: Path) -> None:
    """`unchanged` lets an idle view skip its read: it must never skip one that has news."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "state.json").write_text('{"job": {"name": "j", "phase": "Running"}}')
    (tmp_path / "events.jsonl").write_text("")
    log = tmp_path / "logs" / "a.out"
    log.write_text("one\n")
    source = RunSource(tmp_path)
    source.poll()
    assert source.unchanged()
    with (tmp_path / "events.jsonl").open("a") as handle:
        handle.write('{"ts": 1, "reason": "Started", "object": "job", "message": "m"}\n')
    assert not source.unchanged()
    source.poll()
    assert source.unchanged()
    source.want_log = ("a", "logs/a.out", False)  # a newly selected log: read it
    assert not source.unchanged()
    source.poll()
    assert source.unchanged()
    with log.open("a") as handle:
        handle.write("two\n")
    assert not source.unchanged()
    source.poll()
    source.want_earlier = source.want_log  # lines before those shown, asked for
    assert not source.unchanged()
    source.poll()
    assert source.unchanged()
    replaced = tmp_path / "state.new"
    replaced.write_text('{"job": {"name": "j", "phase": "Failed"}}')
    replaced.replace(tmp_path / "state.json")  # a new snapshot (a new inode)
    assert not source.unchanged()
    source.state_due = False  # a reader pacing its state reads: not a change for now
    assert source.unchanged()


def test_a_change_the_pause_holds_back_is_read_at_once_when_the_job_holds_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big job's state is read no sooner than a pause after the last read (its cost), but
    not once its summary says the job holds still as of a change not read yet."""
    monkeypatch.setattr(frames, "STATE_PAUSE", 1e9)  # after a read: paused for good

    async def body() -> None:
        h = Harness(JOB, tmp_path)
        writer = StateWriter(tmp_path, limit=1, summary_period=0)  # summary.json at once

        def write() -> None:
            writer.write(dict(head(h.store, backend="fake", controller_pid=1)), h.store)

        await h.settle()
        write()
        reader = frames.FrameReader(RunSource(tmp_path), tmp_path, watch_controller=False)
        reader.quiet()
        assert reader.read(0.0, False)[0].state is not None
        h.exit("service_web", 3)  # BackOff: the job does not hold still
        await h.settle()
        write()
        assert reader.quiet()  # the change waits: a poll now would not read it
        assert reader.read(0.0, False)[0].state is None
        for _ in range(100):
            await h.advance(10)
            if "service_web" in h.backend.live:
                break
        write()  # Running again: every instance where it should be
        assert not reader.quiet()  # read now, the pause notwithstanding
        state = reader.read(0.0, False)[0].state
        assert state is not None and _phase(state, "service_web") == "Running"
        assert reader.state is not None and reader.state.seq == writer.seq

    asyncio.run(body())
