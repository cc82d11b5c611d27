"""The TUI's log: following, the full-screen log, search, filter, wrap, times, earlier lines.

What a user sees is tested on a real pseudo-terminal (`pty_util`): `srtr tui RUN_DIR` runs
as its own process against a run dir that this test writes (the test process stands in for
the controller: its pid is in state.json), and the test appends to the instance's log as a
running program would. The pure parts (`viewmodel.LogLines`, `source.LogFollower`) are
tested without Textual.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import struct
import sys
import termios
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pytest
from textual.binding import Binding

from srtr.tui import keys, source
from srtr.tui import viewmodel as vm
from srtr.tui.app import SrtrApp
from srtr.tui.widgets.log_view import LogView
from tests.support.pty_util import PtyProgram
from tests.tui.test_app import fake_run_dir, fake_state, until

ROOT = Path(__file__).resolve().parents[2]
LOG = "logs/service_train_node2.out"  # the instance the TUI selects first


# -- on a real terminal ---------------------------------------------------------------------


def resize(program: PtyProgram, columns: int, lines: int) -> None:
    """Resize the terminal as a window manager does: the kernel sends SIGWINCH.

    The emulated screen keeps its cells where they are, as a terminal window does (pyte's
    own resize drops lines from the top, which no terminal does, and would scramble the
    parts that Textual rightly does not redraw); `text()` then shows the new size only.
    """
    fcntl.ioctl(program.master, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    screen = program.screen
    if columns > screen.columns or lines > screen.lines:
        screen.resize(max(lines, screen.lines), max(columns, screen.columns))
    program.text = lambda: "\n".join(row[:columns] for row in screen.display[:lines])  # type: ignore[method-assign]


def append(run_dir: Path, *lines: str) -> None:
    with (run_dir / LOG).open("a") as handle:
        handle.write("".join(f"{line}\n" for line in lines))


def write_state(run_dir: Path, doc: dict[str, object]) -> None:
    tmp = run_dir / "state.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, run_dir / "state.json")  # as the controller does: a new inode


def wait_screen(program: PtyProgram, ok: Callable[[str], object], what: str) -> str:
    """Pump until `ok(screen)`: a frame can arrive in several reads, so a needle being
    there does not yet mean that the rest of the frame is."""
    deadline = time.monotonic() + 30
    while True:
        program.pump()
        screen = program.text()
        if ok(screen):
            return screen
        if time.monotonic() > deadline or program.proc.poll() is not None:
            raise AssertionError(f"timed out waiting for {what} on screen:\n{screen}")


def full_screen(program: PtyProgram) -> str:
    """`l`, and wait for the full-screen log to have the keys (its own in the footer):
    keys sent in the same instant would still go to the pane that had them."""
    program.send(b"l")
    return program.wait_for_text("/ Search  n Next")


def log_title(screen: str) -> str:
    found = re.search(r"─ log (following|paused|before the last restart) · ", screen)
    return found.group(1) if found else ""


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    return fake_run_dir(tmp_path)


@pytest.fixture()
def beating(run_dir: Path) -> Iterator[None]:
    """A live controller, as the TUI tells one: a fresh heartbeat.json (the fake run dir has
    no controller; without a beat the TUI opens read-only and selects the failed instance)."""
    import socket
    import threading

    from srtr.store.rundir import machine_id

    stop = threading.Event()

    def beat() -> None:
        while True:
            doc = {
                "ts": time.time(),
                "period": 1.0,
                "host": socket.gethostname(),
                "machine": machine_id(),
                "pid": os.getpid(),
                "stopped": False,
            }
            temp = run_dir / "heartbeat.json.tmp"
            temp.write_text(json.dumps(doc))
            temp.rename(run_dir / "heartbeat.json")
            if stop.wait(1.0):
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture()
def tui(run_dir: Path, beating: None) -> Iterator[PtyProgram]:
    # Without COLUMNS and LINES (which PtyProgram sets, and which would win over the
    # terminal's own size), so that a resize of the terminal is seen.
    program = PtyProgram(
        ["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "srtr", "tui", str(run_dir)],
        cwd=ROOT,
        env=dict(os.environ),
        columns=140,
        lines=45,
    )
    try:
        yield program
    finally:
        program.kill()


def test_the_log_pane_keeps_following_across_resizes_and_panels(
    run_dir: Path, tui: PtyProgram
) -> None:
    """Issue 23 item 2: a smaller pane (terminal resized, a recipe panel opening) used to
    leave the view where it was, still titled "following", for good."""
    tui.wait_for_text("step 11 loss")
    tick = 0

    def more_ticks(count: int) -> str:
        nonlocal tick
        for _ in range(count):
            tick += 1
            append(run_dir, f"tick {tick:04d}")
        return f"tick {tick:04d}"

    tui.wait_for_text(more_ticks(3))
    for columns, lines in ((140, 30), (100, 40), (150, 24), (140, 45)):
        resize(tui, columns, lines)
        # More lines than the pane holds: only a view that follows shows the last one.
        last = more_ticks(40)
        screen = tui.wait_for_text(last, timeout=15)
        assert log_title(screen) == "following", screen
    # A recipe edit that is rejected opens its panel above the body: the pane shrinks.
    state = fake_state()
    state["recipe"] = {"rejected": [f"recipe.yaml:{i}: services[0].nodes: bad" for i in range(8)]}
    write_state(run_dir, state)
    tui.wait_for_text("recipe edit rejected")
    screen = tui.wait_for_text(more_ticks(40), timeout=15)
    assert log_title(screen) == "following", screen


def numbered(count: int, width: int = 110) -> list[str]:
    return [f"line {i:05d} " + "x" * (width - 11) for i in range(1, count + 1)]


def test_the_full_screen_log_takes_the_keys_and_loads_a_3000_line_log_whole(
    run_dir: Path, tui: PtyProgram
) -> None:
    """Issue 23 item 3: the full-screen log had no focus (PageUp/Home/f did nothing), `/`
    typed into the hidden instance filter, the title said "following" after a scroll, and
    Home stopped at line 423 of 3,000."""
    # 3,000 lines of 110 bytes: more than the 256 KiB the view used to load.
    (run_dir / LOG).write_text("".join(f"{line}\n" for line in numbered(3000)))
    tui.wait_for_text("line 03000")
    full_screen(tui)  # no Tab needed
    tui.send(b"\x1b[H")  # Home
    screen = tui.wait_for_text("line 00001")
    assert log_title(screen) == "paused", screen
    assert "not loaded" not in screen  # the whole log is there
    tui.send(b"\x1b[F")  # End: back to the bottom, following again
    tui.wait_for_text("line 03000", "log following")
    tui.send(b"\x1b[5~")  # PageUp
    wait_screen(tui, lambda s: log_title(s) == "paused" and "line 03000" not in s, "PageUp")
    tui.send(b"f")  # follow again
    tui.wait_for_text("line 03000", "log following")
    # `/` searches the log (not the hidden instance filter), with a match count.
    tui.send(b"/line 01234\r")
    screen = tui.wait_for_text("/line 01234 1/1")
    assert "line 01234" in screen.replace("/line 01234", "")
    assert log_title(screen) == "paused", screen
    # Esc clears the search, Esc again leaves the full screen: every instance is still listed.
    tui.send(b"\x1b")
    wait_screen(tui, lambda s: "/line 01234" not in s and log_title(s) == "paused", "no search")
    tui.send(b"\x1b")
    screen = tui.wait_for_text("service_napper", "benchmark", "frontend")
    assert "filter:" not in screen


def test_search_highlights_steps_and_filters_the_matching_lines(
    run_dir: Path, tui: PtyProgram
) -> None:
    lines = [f"ok {i}" if i % 100 else f"ERROR number {i}" for i in range(1, 1001)]
    (run_dir / LOG).write_text("".join(f"{line}\n" for line in lines))
    tui.wait_for_text("ERROR number 1000")
    full_screen(tui)
    tui.send(b"/error\r")  # smart case: lower case matches any case
    # The newest match at or above the bottom is the current one: 10 of 10.
    screen = tui.wait_for_text("/error 10/10")
    tui.send(b"N")
    screen = tui.wait_for_text("/error 9/10", "ERROR number 900")
    tui.send(b"NNN")
    screen = tui.wait_for_text("/error 6/10", "ERROR number 600")
    tui.send(b"n")
    tui.wait_for_text("/error 7/10", "ERROR number 700")
    # The current match is highlighted: its cells are drawn on a coloured background.
    row = next(y for y, text in enumerate(tui.screen.display) if "ERROR number 700" in text)
    column = tui.screen.display[row].index("ERROR number 700")
    assert tui.screen.buffer[row][column].bg not in ("default", "black")
    # `&`: only the matching lines; new lines that match join them as they arrive.
    tui.send(b"&")
    screen = tui.wait_for_text("matching lines only", "ERROR number 100")
    assert "ok 5" not in screen and "ok 999" not in screen
    append(run_dir, "ok 1001", "an error arrives")
    screen = tui.wait_for_text("an error arrives")
    assert "ok 1001" not in screen
    tui.send(b"&G")
    tui.wait_for_text("ok 1001")


def test_wrap_and_read_times(run_dir: Path, tui: PtyProgram) -> None:
    long_line = "start " + "y" * 300 + " THE END"
    (run_dir / LOG).write_text(f"short\n{long_line}\n")
    tui.wait_for_text("start yyy")
    screen = full_screen(tui)
    assert "THE END" not in screen  # one row per line: the end is off to the right
    tui.send(b"w")
    screen = tui.wait_for_text("THE END", "wrap")
    tui.send(b"t")
    # Lines that were in the file before the view opened have no known time.
    screen = tui.wait_for_text("--:--:-- short", "times: when read")
    append(run_dir, "fresh line")
    screen = tui.wait_for_text("fresh line")
    assert re.search(r"\d\d:\d\d:\d\d fresh line", screen), screen


def test_a_big_log_says_what_is_not_loaded_and_L_loads_it(run_dir: Path, tui: PtyProgram) -> None:
    lines = numbered(50_000, width=100)  # 5 MB: more than the 4 MiB the view loads first
    (run_dir / LOG).write_text("".join(f"{line}\n" for line in lines))
    data = (run_dir / LOG).read_bytes()
    first = len(data) - source.LOG_TAIL
    first = data.index(b"\n", first - 1) + 1  # the view starts at a whole line
    missing = data[:first].count(b"\n")
    tui.wait_for_text("line 50000")
    full_screen(tui)
    tui.send(b"\x1b[H")
    tui.wait_for_text(f"… {missing:,} earlier lines not loaded (press L to load them)")
    tui.send(b"L")
    screen = tui.wait_for_text("line 00001")
    assert "not loaded" not in screen


def test_every_log_key_is_in_the_help_and_in_docs() -> None:
    help_keys = dict(keys.help_keys(keys.BINDINGS, keys.OTHER_KEYS))
    cli = (ROOT / "docs" / "cli.md").read_text()
    for binding in keys.LOG_BINDINGS:
        assert isinstance(binding, Binding)
        if binding.key == "escape":
            continue
        shown = binding.key_display or binding.key
        assert shown in help_keys, shown
        assert f"`{shown.split()[0]}`" in cli, shown


def test_notes_in_the_first_row_come_and_go(run_dir: Path) -> None:
    """Pilot: "[no output yet]" gives way to the first line; "[the log was truncated]" stays;
    a search that matches nothing says so."""
    path = run_dir / LOG
    path.unlink()
    app = SrtrApp(run_dir, check_controller=False)

    async def scenario() -> None:
        async with app.run_test(size=(140, 45)) as pilot:
            log = app.query_one(LogView)
            await until(pilot, lambda: log.model.head == "[no output yet]", "the note")
            path.write_text("hello\n")
            await until(pilot, lambda: log.lines == ["hello"], "the first line")
            assert log.model.head == ""
            path.write_text("x\n")  # replaced by a shorter file: read again from the start
            await until(pilot, lambda: log.lines == ["x"], "the new file")
            with path.open("a") as handle:
                handle.write("more\n")
            await until(pilot, lambda: log.lines == ["x", "more"], "the next line")
            assert log.model.head == "[the log was truncated]"
            await pilot.press("l", "slash", *"zzz", "enter")
            await until(pilot, lambda: "/zzz: no match" in str(log.border_subtitle), "no match")

    asyncio.run(scenario())


# -- without Textual ------------------------------------------------------------------------


def test_log_lines_search_filter_and_rows() -> None:
    model = vm.LogLines(cap=1000)
    model.append(["alpha", "Beta", "gamma beta", "delta"], at=None)
    model.set_pattern(vm.search_pattern("beta"))
    assert model.matches == [1, 2]
    assert vm.match_spans(model.pattern, "a beta BETA") == [(2, 6), (7, 11)]
    assert not vm.Search("Beta").search("gamma beta")  # a capital: exact case
    assert model.next_match(1, forward=True) == 2
    assert model.next_match(2, forward=True) == 1  # wraps around
    assert model.next_match(1, forward=False) == 2
    model.append(["beta again"], at=5.0)
    assert model.matches == [1, 2, 4] and model.times[-1] == 5.0
    model.set_only_matching(True)
    assert model.rows == 3 and model.row(0) == (1, 0) and model.row(2) == (4, 0)
    assert model.row_of(3) == 2  # not shown: the next shown line's row
    model.head = "… 7 earlier lines not loaded"
    assert model.rows == 4 and model.row(0) == (-1, 0) and model.row(1) == (1, 0)
    model.head = ""
    model.set_only_matching(False)
    model.set_layout(wrap=True, width=4)
    # "alpha" 2 rows, "Beta" 1, "gamma beta" 3, "delta" 2, "beta again" 3
    assert model.rows == 11
    assert model.row(2) == (1, 0) and model.row(5) == (2, 2) and model.row(10) == (4, 2)
    assert model.row_of(3) == 6
    model.append(["12345678"], at=None)
    assert model.rows == 13 and model.row(12) == (5, 1)
    model.prepend(["beta zero"])
    assert model.matches == [0, 2, 3, 5] and model.times[0] is None


def test_log_lines_cost_only_the_new_lines_per_append() -> None:
    """A search over 100k lines must not be redone for each new line."""
    model = vm.LogLines(cap=200_000)
    model.append([f"line {i}" for i in range(100_000)], at=None)
    calls = [0]

    class Counting(vm.Search):
        def matching(self, lines: Sequence[str], indices: Iterable[int]) -> list[int]:
            tested = list(indices)
            calls[0] += len(tested)
            return super().matching(lines, tested)

    model.set_pattern(Counting("7"))
    assert calls[0] == 100_000
    model.set_layout(wrap=True, width=40)
    calls[0] = 0
    model.append(["line 7 new"], at=None)
    assert calls[0] == 1 and model.matches[-1] == 100_000


def test_log_lines_drop_the_oldest_past_the_cap_in_batches() -> None:
    model = vm.LogLines(cap=100)
    model.set_pattern(vm.search_pattern("x"))
    model.append([f"x{i}" for i in range(101)], at=None)
    assert len(model.lines) == 90 and model.dropped == 11
    assert model.lines[0] == "x11" and model.matches[0] == 0


def test_log_follower_loads_earlier_lines_down_to_the_attempt(tmp_path: Path) -> None:
    log = tmp_path / "svc.out"
    marker = "==== srtr: svc attempt 1 starting on node1 at 2026-01-01T00:00:00Z ===="
    log.write_text("old\n" + marker + "\n" + "".join(f"l{i:03d}\n" for i in range(100)))
    follower = source.LogFollower(log, ("svc", "svc.out", False), tail=50)
    first = follower.read()
    assert first.lines[-1] == "l099" and first.not_loaded_bytes > 0
    assert first.not_loaded_lines == 101 - len(first.lines)
    got = first.lines
    while True:
        chunk = follower.earlier()
        assert chunk.earlier
        if not chunk.lines:
            break
        got = chunk.lines + got
    assert got == [marker] + [f"l{i:03d}" for i in range(100)]  # never the attempt before
    assert chunk.not_loaded_lines == 0 and chunk.not_loaded_bytes == 0
