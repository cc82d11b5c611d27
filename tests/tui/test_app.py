"""The TUI: run-dir reading, the App against a real controller (Pilot), and snapshots.

- `source.py` is tested on real files: partial lines, bounded reads, a writer racing the
  reader, huge lines, truncation, restart markers across read blocks.
- `SrtrApp` is driven with Pilot against a real `srtr up --headless` (local backend): pools
  and instances appear, `/` filters, a selected instance's log shows, `r` restarts it,
  `T` tears the job down. Waits poll observable state with a timeout; nothing sleeps a
  fixed time. Every process of a run is gone when a test ends.
- The main screen is compared with SVG snapshots (pytest-textual-snapshot) for a fixed,
  hand-made run dir, with "now" injected so ages and elapsed times never move.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from srtr.tui import source
from srtr.tui import viewmodel as vm
from srtr.tui.app import SrtrApp
from srtr.tui.launch import attach
from srtr.tui.widgets.confirm import ConfirmModal
from srtr.tui.widgets.events_pane import EventsPane
from srtr.tui.widgets.help_screen import HelpScreen
from srtr.tui.widgets.instances_table import InstancesTable
from srtr.tui.widgets.job_header import JobHeader
from srtr.tui.widgets.log_view import LogView
from srtr.tui.widgets.pools_panel import PoolsPanel
from tests.support.e2e_util import Run, read_state, wait_for

NOW = 1_800_000_000.0
SIZE = (150, 46)


async def until(
    pilot: Pilot[Any], predicate: Callable[[], Any], what: str, within: float = 30
) -> Any:
    """Let the app run until `predicate()` is truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def marker(name: str, attempt: int) -> str:
    return f"==== srtr: {name} attempt {attempt} starting on node1 at 2026-01-01T00:00:00Z ===="


# -- source.py: reading files as they grow ---------------------------------------------------


def test_tail_carries_a_partial_last_line_until_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "f.out"
    tail = source.LineTail(path)
    assert tail.read() == []  # no file yet
    path.write_bytes(b"one\ntw")
    assert tail.read() == ["one"]
    with path.open("ab") as handle:
        handle.write(b"o\n\nthree")
    assert tail.read() == ["two", ""]
    with path.open("ab") as handle:
        handle.write(b"\n")
    assert tail.read() == ["three"]


def test_tail_reads_in_bounded_chunks_and_drops_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.out"
    lines = [f"line {i} " + "x" * (i % 37) for i in range(2000)]
    path.write_text("".join(f"{line}\n" for line in lines))
    tail = source.LineTail(path, max_read=1000)
    got = tail.read()
    assert tail.behind
    while tail.behind:
        got += tail.read()
    assert got == lines


def test_tail_keeps_up_with_a_fast_writer(tmp_path: Path) -> None:
    path = tmp_path / "f.out"
    path.touch()
    expected = [f"{i}:" + "y" * (i * 7919 % 3000) for i in range(20_000)]

    def writer() -> None:
        # Unbuffered small writes that cut lines anywhere: the reader sees partial lines.
        with path.open("ab", buffering=0) as handle:
            data = "".join(f"{line}\n" for line in expected).encode()
            for start in range(0, len(data), 4093):
                handle.write(data[start : start + 4093])

    thread = threading.Thread(target=writer)
    thread.start()
    tail = source.LineTail(path, max_read=64 * 1024)
    got: list[str] = []
    while thread.is_alive():
        got += tail.read()  # races the writer: partial lines, a file that keeps growing
    thread.join()
    got += tail.read()
    while tail.behind:
        got += tail.read()
    assert got == expected


def test_a_huge_line_arrives_in_pieces_and_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.out"
    line = "é" * 150_000  # two bytes each: pieces must not split a character
    path.write_text(line + "\n")
    tail = source.LineTail(path, max_read=32 * 1024, max_line=10_000)
    pieces: list[str] = []
    while True:
        pieces += tail.read()
        if not tail.behind:
            break
    assert all(len(p.encode()) <= 10_000 for p in pieces)
    assert "".join(pieces) == line


def test_a_truncated_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "f.out"
    path.write_text("a\nb\n")
    tail = source.LineTail(path)
    assert tail.read() == ["a", "b"]
    path.write_text("c\n")
    assert tail.read() == ["c"]
    assert tail.restarted


def test_the_last_marker_is_found_across_read_blocks(tmp_path: Path) -> None:
    path = tmp_path / "f.out"
    name = "svc"
    # Put the marker so that it straddles the 64 KiB block boundary, counted from the end.
    head = "a" * 100 + "\n" + marker(name, 1) + "\n"
    body = "b" * (64 * 1024 - 40) + "\n"
    path.write_text(head + "z" * 70_000 + "\n" + marker(name, 2) + "\n" + body)
    text = path.read_bytes()
    expected = text.rfind(b"==== srtr: ")
    assert source.last_marker_offset(path) == expected
    assert source.last_marker_offset(path, end=expected) == text.find(b"==== srtr: ")
    assert source.last_marker_offset(tmp_path / "missing") is None


def test_log_follower_current_attempt_and_previous(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "svc.out"
    log.parent.mkdir()
    log.write_text(f"old 1\nold 2\n{marker('svc', 1)}\nnew 1\n")
    current = source.LogFollower(log, ("svc", "logs/svc.out", False))
    first = current.read()
    assert first.reset and first.lines == [marker("svc", 1), "new 1"]
    assert first.skipped == len("old 1\nold 2\n")
    with log.open("a") as handle:
        handle.write("new 2\n")
    assert current.read().lines == ["new 2"]
    previous = source.LogFollower(log, ("svc", "logs/svc.out", True)).read()
    assert previous.lines == ["old 1", "old 2"]
    log.write_text("never restarted\n")
    lonely = source.LogFollower(log, ("svc", "logs/svc.out", True)).read()
    assert lonely.lines == [] and "no previous" in lonely.note


# -- a fixed run dir, for snapshots and key handling ----------------------------------------


def fake_instance(name: str, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name,
        "service": "train",
        "kind": "owner",
        "pool": "train",
        "index": 0,
        "node": "node2",
        "node_ip": "127.0.0.3",
        "phase": "Ready",
        "ready": True,
        "restarts": 0,
        "exit_code": None,
        "pid": 4242,
        "step": None,
        "log": f"logs/{name}.out",
        "shutdown_tier": 0,
        "critical": False,
        "terminal": False,
        "command": ["sleep", "infinity"],
        "env": {},
        "probe": None,
        "probe_message": "",
        "started_at": NOW - 300,
        "ready_at": NOW - 298,
        "stop_grace_seconds": 30.0,
        "stop_deadline": None,
        "next_start_at": None,
        "history": [],
        "conditions": [],
    }
    doc.update(over)
    return doc


def fake_state(phase: str = "Running") -> dict[str, Any]:
    train2 = fake_instance(
        "service_train_node2",
        command=["torchrun", "--nnodes", "2", "--master-addr", "127.0.0.3", "train.py"],
        env={"MASTER_PORT": "29500", "HF_TOKEN": "****"},
        probe="http://127.0.0.3:8000/health -> 200",
        restarts=1,
        started_at=NOW - 95,
        history=[
            {"attempt": 0, "exit_code": 1, "signal": None, "at": NOW - 96, "message": "exit 1"}
        ],
        conditions=[
            {
                "type": "Ready",
                "status": "True",
                "reason": "ProbePassed",
                "message": "http://127.0.0.3:8000/health -> 200",
                "last_transition": NOW - 90,
            }
        ],
    )
    train3 = fake_instance(
        "service_train_node3",
        node="node3",
        node_ip="127.0.0.4",
        index=1,
        phase="BackOff",
        ready=False,
        restarts=2,
        exit_code=137,
        next_start_at=NOW + 4,
        history=[
            {"attempt": 1, "exit_code": 137, "signal": 9, "at": NOW - 3, "message": "OOM"},
        ],
    )
    instances = [
        train2,
        train3,
        fake_instance(
            "service_napper",
            service="napper",
            pool="napper",
            node="node4",
            node_ip="127.0.0.5",
            phase="Failed",
            ready=False,
            exit_code=3,
            history=[{"attempt": 0, "exit_code": 3, "signal": None, "at": NOW - 60, "message": ""}],
        ),
        fake_instance("service_watcher_node2", service="watcher", kind="rider"),
        fake_instance(
            "service_watcher_node3",
            service="watcher",
            kind="rider",
            node="node3",
            node_ip="127.0.0.4",
            phase="Starting",
            ready=False,
            started_at=NOW - 2,
        ),
        fake_instance(
            "frontend",
            service="frontend",
            kind="frontend",
            pool=None,
            node="node1",
            node_ip="127.0.0.2",
            shutdown_tier=1,
        ),
        fake_instance(
            "benchmark",
            service="benchmark",
            kind="benchmark",
            pool=None,
            node="node1",
            node_ip="127.0.0.2",
            phase="Pending",
            ready=False,
            started_at=None,
            ready_at=None,
            pid=None,
            shutdown_tier=2,
        ),
    ]
    if phase == "TearingDown":
        instances[0].update(phase="Terminating", stop_deadline=NOW + 21.6)
        instances[3].update(phase="Terminating", stop_deadline=None)
        instances[4].update(phase="Stopped", ready=False)
        instances[1].update(phase="Stopped")
    return {
        "job": {
            "name": "snapdemo",
            "backend": "local",
            "phase": phase,
            "exit_code": None,
            "reason": "torn down by user" if phase == "TearingDown" else "",
            "generation": 2,
            "observed_generation": 2,
            "controller_pid": os.getpid(),
            "slurm_job_id": None,
            "stage": 3,
            "stages": [
                "after_frontend/train",
                "after_frontend/napper",
                "after_frontend/watcher",
                "frontend",
                "benchmark",
            ],
            "started_at": NOW - 754,
            "ended_at": None,
            "conditions": [],
            "control": "/nonexistent/control.sock",
        },
        "nodes": [
            {"name": "node1", "ip": "127.0.0.2", "state": "worker"},
            {"name": "node2", "ip": "127.0.0.3", "state": "pool:train"},
            {"name": "node3", "ip": "127.0.0.4", "state": "pool:train"},
            {"name": "node4", "ip": "127.0.0.5", "state": "pool:napper"},
        ],
        "pools": [
            {
                "name": "train",
                "type": "generic",
                "nodes": ["node2", "node3"],
                "riders": ["watcher"],
                "ready": False,
            },
            {"name": "napper", "type": "generic", "nodes": ["node4"], "riders": [], "ready": False},
        ],
        "instances": instances,
        "exporters": [],
    }


FAKE_EVENTS = [
    (NOW - 754, "Normal", "Started", "job", "snapdemo: 7 instance(s) on 4 local node(s)"),
    (NOW - 300, "Normal", "Launched", "instance/service_train_node2", "on node2 (pid 4000)"),
    (NOW - 96, "Warning", "Exited", "instance/service_train_node2", "exited with code 1"),
    (NOW - 95, "Normal", "Restarting", "instance/service_train_node2", "attempt 1 on node2"),
    (NOW - 60, "Warning", "Exited", "instance/service_napper", "exited with code 3 on node4"),
    (NOW - 3, "Warning", "Exited", "instance/service_train_node3", "exited with signal 9"),
    (NOW - 3, "Normal", "BackOff", "instance/service_train_node3", "restart in 4s"),
]


def fake_run_dir(root: Path, phase: str = "Running") -> Path:
    run_dir = root / "fake-run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "state.json").write_text(json.dumps(fake_state(phase)))
    with (run_dir / "events.jsonl").open("w") as handle:
        for ts, kind, reason, obj, message in FAKE_EVENTS:
            event = {
                "ts": ts,
                "type": kind,
                "reason": reason,
                "object": obj,
                "message": message,
                "generation": 1,
            }
            handle.write(json.dumps(event) + "\n")
    (run_dir / "logs" / "service_train_node2.out").write_text(
        "loading shards\nTraceback: CUDA error\n"
        + marker("service_train_node2", 1)
        + "\n"
        + "".join(f"step {i} loss {4.0 - i / 10:.2f}\n" for i in range(12))
    )
    return run_dir


def fixed_app(run_dir: Path) -> SrtrApp:
    return SrtrApp(run_dir, clock=lambda: NOW, check_controller=False)


async def loaded(pilot: Pilot[Any]) -> None:
    """Wait until the first frame and the selected instance's log are on screen."""
    app = pilot.app
    assert isinstance(app, SrtrApp)
    log = app.query_one(LogView)
    await until(pilot, lambda: app.frames > 0 and log.lines_received > 0, "the first frame")


# -- snapshots --------------------------------------------------------------------------------


def test_snapshot_main_screen(tmp_path: Path, snap_compare: Any) -> None:
    app = fixed_app(fake_run_dir(tmp_path))
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_snapshot_teardown_view(tmp_path: Path, snap_compare: Any) -> None:
    app = fixed_app(fake_run_dir(tmp_path, "TearingDown"))
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_snapshot_help_lists_every_key(tmp_path: Path, snap_compare: Any) -> None:
    app = fixed_app(fake_run_dir(tmp_path))
    assert snap_compare(app, terminal_size=SIZE, press=["question_mark"], run_before=loaded)


# -- keys on the fixed run dir --------------------------------------------------------------


def test_ctrl_c_asks_then_a_second_ctrl_c_tears_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str | None]] = []

    def fake_send(run_dir: Path, op: str, instance: str | None = None) -> str:
        sent.append((op, instance))
        return f"{op} sent"

    monkeypatch.setattr("srtr.tui.app_intents.send", fake_send)
    app = fixed_app(fake_run_dir(tmp_path))
    asyncio.run(ctrl_c_scenario(app, sent))
    assert ("kill", None) not in sent[:-1]  # "n" refused the first kill


async def ctrl_c_scenario(app: SrtrApp, sent: list[tuple[str, str | None]]) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the confirmation")
        await pilot.press("ctrl+c")
        # Ctrl+C asks for the teardown as `interrupt`: the job then exits 130 (issue 12).
        await until(pilot, lambda: sent == [("interrupt", None)], "the teardown intent")
        # Now tearing down: Ctrl+C asks to kill, and a second one confirms.
        await pilot.press("ctrl+c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the kill question")
        await pilot.press("n")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "restart question")
        await pilot.press("y")
        await until(pilot, lambda: ("restart", "service_train_node2") in sent, "restart")
        await pilot.press("ctrl+c", "ctrl+c")
        await until(pilot, lambda: sent[-1] == ("kill", None), "the kill intent")


def test_a_finished_job_in_srtr_up_closes_by_itself_with_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = fake_run_dir(tmp_path)
    enders: list[Callable[[], object]] = []  # one per scenario: each has its own loop

    def fake_send(run_dir: Path, op: str, instance: str | None = None) -> str:
        enders[-1]()  # the fake job ends when told to tear down
        return "tearing down"

    monkeypatch.setattr("srtr.tui.app_intents.send", fake_send)
    for user in ("nothing", "reading", "ctrl+c"):
        assert asyncio.run(up_scenario(run_dir, enders, user)) == 3, user


def header_text(app: SrtrApp) -> str:
    return str(app.query_one(JobHeader).content)


async def up_scenario(run_dir: Path, enders: list[Callable[[], object]], user: str) -> int | None:
    """`srtr up` mode with a fake job that ends (code 3) once `release` is set.

    nothing: the App exits by itself after the job ends. reading: a key pressed during the
    countdown keeps it open until `q`. ctrl+c: the user's own teardown ends the job, and the
    App then closes by itself although keys were just pressed.
    """
    (run_dir / "state.json").write_text(json.dumps(fake_state()))
    release = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Intents are sent from a worker thread: set the event from the loop's own thread.
    enders.append(lambda: loop.call_soon_threadsafe(release.set))

    async def job() -> int:
        await release.wait()
        state = fake_state("Failed")
        state["job"]["ended_at"] = NOW
        (run_dir / "state.json").write_text(json.dumps(state))
        return 3

    task = asyncio.create_task(job())
    # Reading: a long countdown, so the key surely lands before it runs out.
    app = SrtrApp(run_dir, job=task, clock=lambda: NOW, exit_after=60 if user == "reading" else 0.3)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        if user == "ctrl+c":
            await pilot.press("ctrl+c", "ctrl+c")
        else:
            release.set()
        if user == "reading":
            await until(pilot, lambda: "closing in" in header_text(app), "the countdown")
            await pilot.press("down")
            await until(pilot, lambda: "q quits" in header_text(app), "the countdown to stop")
            assert app.return_code is None and app.is_running
            await pilot.press("q")
        await until(pilot, lambda: app.return_code is not None, "the app to exit")
        return app.return_value


def test_the_log_view_drops_no_line_of_a_fast_writer(tmp_path: Path) -> None:
    run_dir = fake_run_dir(tmp_path)
    path = run_dir / "logs" / "service_train_node2.out"
    written = [f"burst {i} " + "z" * (i % 200) if i % 97 else "" for i in range(30_000)]
    written[12_345] = "w" * 100_000  # one very long line, cut by no reader
    app = fixed_app(run_dir)

    async def scenario() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            log = app.query_one(LogView)
            before = len(log.lines)

            def writer() -> None:
                with path.open("ab", buffering=0) as handle:
                    data = "".join(f"{line}\n" for line in written).encode()
                    for start in range(0, len(data), 8191):
                        handle.write(data[start : start + 8191])

            thread = threading.Thread(target=writer)
            thread.start()
            expected = vm.display_lines(written)
            await until(pilot, lambda: len(log.lines) >= before + len(expected), "every line")
            thread.join()
            assert list(log.lines[before:]) == expected

    asyncio.run(scenario())


def test_a_failing_read_is_reported_and_reading_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = [0]
    real_poll = source.RunSource.poll

    def flaky_poll(self: source.RunSource) -> source.Poll:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("disk on fire")
        return real_poll(self)

    monkeypatch.setattr(source.RunSource, "poll", flaky_poll)
    monkeypatch.setattr("srtr.tui.app.RESTART_READER_AFTER", 0.05)
    app = fixed_app(fake_run_dir(tmp_path))
    notes: list[str] = []
    monkeypatch.setattr(app, "notify", lambda message, **_: notes.append(str(message)))

    async def scenario() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)  # the reader came back and showed the run
            assert any("disk on fire" in note for note in notes)

    asyncio.run(scenario())


def test_attach_refuses_a_run_dir_without_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A finished job or a dead controller opens read-only (tests/tui/test_screens.py); a run dir
    # with nothing to show is refused.
    assert attach(tmp_path) == 2
    assert "cannot read" in capsys.readouterr().err


# -- against a real controller ---------------------------------------------------------------

LIVE = """
name: tuilive
services:
  - name: train
    command: ["bash", "-c", "while true; do echo step $RANDOM; sleep 0.2; done"]
    nodes: 2
    stop_grace_seconds: 5
  - name: watcher
    command: ["sleep", "1000"]
    placement: {pool: train}
    stop_grace_seconds: 5
"""


def stop_run(run: Run) -> None:
    """Leave no process of the run behind, whatever the test did."""
    if run.proc.poll() is None:
        subprocess.run(
            [sys.executable, "-m", "srtr", "down", "--now", str(run.run_dir)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        try:
            run.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.close()
    run.close()
    for pid in run.leftovers():
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not run.leftovers(), 10, "every process of the run to be gone")


def instance_state(run: Run, name: str) -> dict[str, Any] | None:
    state = read_state(run.run_dir)
    if state is None:
        return None
    return next((i for i in state["instances"] if i["name"] == name), None)


@pytest.mark.e2e
def test_watch_filter_read_restart_and_tear_down_a_real_job(tmp_path: Path) -> None:
    run = Run(tmp_path, LIVE)
    try:
        asyncio.run(live_scenario(run))
        assert run.proc.returncode == 128 + signal.SIGTERM
        state = read_state(run.run_dir)
        assert state is not None and state["job"]["phase"] == "Failed"
    finally:
        stop_run(run)


async def live_scenario(run: Run) -> None:
    run.wait_state(
        lambda s: (
            s["job"]["phase"] == "Running" and all(i["phase"] == "Running" for i in s["instances"])
        ),
        what="every instance running",
    )
    app = SrtrApp(run.run_dir)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(InstancesTable)
        pools = app.query_one(PoolsPanel)
        # Pools and instances appear.
        await until(pilot, lambda: table.row_count == 4, "four instances in the table")
        await until(pilot, lambda: "train 2/2 ready" in str(pools.content), "pool summary")
        assert "watcher 2/2 ready" in str(pools.content)
        assert "Started" in app.query_one(EventsPane).text

        # `/` narrows the table; Escape in the filter clears it.
        await pilot.press("slash", *"watcher")
        await until(pilot, lambda: table.row_count == 2, "the filter to narrow the table")
        assert set(table.shown) == {"service_watcher_node1", "service_watcher_node2"}
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == 4, "the filter to be cleared")
        assert app.focused is table

        # Selecting an instance shows its log, following the file.
        log = app.query_one(LogView)
        target = "service_train_node2"
        assert table.selected == "service_watcher_node1"  # the selection survived the filter
        await pilot.press("g", "down")  # the first row, then the next: train's second one
        await until(pilot, lambda: table.selected == target, "the cursor on node2")
        await until(
            pilot,
            lambda: log.instance == target and any("step" in s for s in log.lines),
            "its log",
        )
        shown = len(log.lines)
        await until(pilot, lambda: len(log.lines) > shown, "new log lines to follow")

        # `r` (confirmed) restarts it: state.json then shows attempt 1, and restarts=0 (a
        # restart the user asked for is planned, not a crash).
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the confirmation")
        await pilot.press("y")
        await until(
            pilot,
            lambda: (
                (i := instance_state(run, target)) and i["attempt"] == 1 and i["phase"] == "Running"
            ),
            "state.json to show the restart",
        )
        assert instance_state(run, target)["restarts"] == 0
        column = table.get_column_index("restarts")
        assert str(table.get_cell_at(table.cursor_coordinate._replace(column=column))) == "0"
        assert table.selected == target  # the selection survived the live updates
        await until(pilot, lambda: any("attempt 1 starting" in s for s in log.lines), "the marker")
        # `p`: the log from before the restart; again: back to the current attempt.
        await pilot.press("p")
        await until(pilot, lambda: log.previous and log.lines_received > 0, "previous log")
        assert not any("attempt 1 starting" in s for s in log.lines)
        await pilot.press("p")
        await until(pilot, lambda: not log.previous, "the current log again")

        # `T` (confirmed) tears the job down; the controller exits.
        await pilot.press("T")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: run.proc.poll() is not None, "srtr up to exit", 60)
        await until(pilot, lambda: app.frame and app.frame.ended, "the ended job on screen")
        assert "read-only" in header_text(app)
        await pilot.press("q")


@pytest.mark.e2e
def test_attach_to_a_headless_run_shows_help_and_quits_leaving_it_running(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, LIVE)
    try:
        asyncio.run(attach_scenario(run))
        assert run.proc.poll() is None  # attached: quitting leaves the job alone
    finally:
        stop_run(run)


async def attach_scenario(run: Run) -> None:
    run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
    app = SrtrApp(run.run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.query_one(InstancesTable).row_count == 4, "rows")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.press("escape", "q")
        await until(pilot, lambda: app.return_code is not None, "q to quit")
