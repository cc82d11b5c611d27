"""The TUI's screens on a real pseudo-terminal (issue 23): the end of a job, narrow and wide
layouts, a finished run's post-mortem, detaching, themes, the probe gate's countdown.

Each test runs `python -m srtr up` (or `srtr tui`) on a pty (`pty_util.PtyProgram`), reads
the screen as a terminal shows it (pyte) and waits on what is on it, never for a fixed
time. Every process of a run is gone when a test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from srtr.tui import viewmodel as vm
from srtr.tui.app import SrtrApp
from srtr.tui.launch import detach_lines
from srtr.tui.widgets.confirm import ConfirmModal
from tests.support.e2e_util import read_state, wait_for
from tests.support.pty_util import PtyProgram
from tests.tui.test_app import NOW, fake_run_dir, fake_state, header_text, until

pytestmark = pytest.mark.e2e

LEAVE_ALT_SCREEN = b"\x1b[?1049l"  # Textual is done: what follows is on the normal screen


def srtr(*args: str) -> list[str]:
    return [sys.executable, "-m", "srtr", *args]


def processes_with(marker: str) -> list[int]:
    """Pids whose environment holds `marker` (every process of a run has SRTR_RUN_DIR)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def programs(tmp_path: Path) -> Iterator[list[tuple[PtyProgram, Path]]]:
    """Programs the test started on ptys, with their run dirs: all gone at the end."""
    started: list[tuple[PtyProgram, Path]] = []
    yield started
    for program, _ in started:
        program.kill()
    for _, run_dir in started:
        marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0"
        for pid in processes_with(marker):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, 9)
        wait_for(lambda m=marker: not processes_with(m), 30, "the run's processes to be gone")


def start(
    programs: list[tuple[PtyProgram, Path]],
    argv: list[str],
    run_dir: Path,
    cwd: Path,
    *,
    columns: int = 140,
    lines: int = 45,
    env: dict[str, str] | None = None,
) -> PtyProgram:
    program = PtyProgram(
        argv, cwd=cwd, env={**os.environ, **(env or {})}, columns=columns, lines=lines
    )
    programs.append((program, run_dir))
    return program


def after_tui(program: PtyProgram) -> str:
    """What the program printed once the TUI had left the terminal."""
    raw = bytes(program.raw)
    cut = raw.rfind(LEAVE_ALT_SCREEN)
    assert cut >= 0, "the TUI never left the alternate screen"
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw[cut:].decode("utf-8", "replace"))


def colour_of(program: PtyProgram, word: str) -> str:
    """The foreground colour of the first `word` on the screen."""
    for y, line in enumerate(program.screen.display):
        x = line.find(word)
        if x >= 0:
            return str(program.screen.buffer[y][x].fg)
    raise AssertionError(f"no {word!r} on screen:\n{program.text()}")


def gone(program: PtyProgram, text: str, timeout: float = 30) -> None:
    """Wait until `text` is no longer on the screen."""

    def absent() -> bool:
        program.pump()
        return text not in program.text()

    wait_for(absent, timeout, f"{text!r} to leave the screen")


def footer(program: PtyProgram) -> str:
    return program.screen.display[-1]


# -- item 4: the end of a job under the TUI ------------------------------------------------

ENDING = textwrap.dedent(
    """\
    name: ending
    services:
      - name: fine
        command: ["bash", "-c", "sleep 1; exit 0"]
        nodes: 1
        terminal: true
      - name: broken
        command: ["bash", "-c", "sleep 2; exit 3"]
        nodes: 1
        terminal: true
    """
)


def test_the_end_of_a_job_counts_down_offers_no_intents_and_is_printed(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    recipe = tmp_path / "ending.yaml"
    recipe.write_text(ENDING)
    run_dir = tmp_path / "run"
    program = start(programs, srtr("up", str(recipe), "--run-dir", str(run_dir)), run_dir, tmp_path)
    program.wait_for_text("service_fine", "service_broken", "Restart")
    # The job ends (exit 3): the banner counts down, second by second.
    program.wait_for_text("closing in 3s")
    screen = program.wait_for_text("closing in 2s")
    # An ended job takes no intents: the footer no longer offers them.
    assert "Restart" not in footer(program) and "Teardown" not in footer(program), screen
    assert "Stop" not in footer(program), screen
    # The instance that failed the job is selected: the detail pane shows it.
    assert "╭─ service_broken" in screen, screen
    # JobFailed is red in the events pane, as red as a Failed phase; other warnings are not.
    job_failed, tearing_down = colour_of(program, "JobFailed"), colour_of(program, "TearingDown")
    assert job_failed == colour_of(program, "Failed ") != tearing_down
    assert program.wait(30) == 3, program.text()
    program.pump(0.2)
    printed = after_tui(program)
    # What a headless `srtr up` ends with: the reason, the exit code and the run dir.
    assert "JobFailed        job: exit code 3: terminal service(s) failed" in printed, printed
    assert f"run dir: {run_dir}  (srtr status {run_dir})" in printed, printed


def test_a_succeeded_instance_shows_no_stale_probe_failure() -> None:
    inst: dict[str, Any] = {
        "name": "svc",
        "phase": "Succeeded",
        "probe": "tcp 127.0.0.2:80",
        "probe_message": "tcp 127.0.0.2:80: connection refused",
        "ready": True,
    }
    view = vm.detail(inst, 0.0, last_probe_failure="connection refused")
    assert not view.probe_state.startswith("failing"), view.probe_state
    assert view.last_probe_failure == ""
    failed = vm.detail({**inst, "phase": "Failed", "ready": False}, 0.0)
    assert failed.probe_state == "never passed"
    assert failed.last_probe_failure.endswith("connection refused")  # still a clue there


# -- a failing probe counts down to its stage gate -------------------------------------------

PROBING = textwrap.dedent(
    """\
    name: probing
    services:
      - name: api
        command: ["sleep", "1000"]
        nodes: 1
        readiness: {port: 7999, timeout_seconds: 40, interval_seconds: 0.2}
    """
)


def gate_left(screen: str) -> int | None:
    match = re.search(r"probe failing: gate fails in (\d+)s", screen)
    return None if match is None else int(match.group(1))


def test_a_failing_probe_shows_how_long_until_the_stage_gate_fails(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    recipe = tmp_path / "probing.yaml"
    recipe.write_text(PROBING)
    run_dir = tmp_path / "run"
    program = start(programs, srtr("up", str(recipe), "--run-dir", str(run_dir)), run_dir, tmp_path)
    first = gate_left(program.wait_for_text("probe failing: gate fails in"))
    assert first is not None and 0 < first <= 40
    # It counts down (the header's clock ticks every second).
    wait_for(
        lambda: (program.pump(), (left := gate_left(program.text())) is not None and left < first)[
            1
        ],
        20,
        "the gate countdown to tick",
    )
    state = read_state(run_dir)
    assert state is not None
    inst = state["instances"][0]
    assert inst["probe_gate"] is True and inst["probe_deadline"] > inst["started_at"]
    program.send(b"\x03")
    program.wait_for_text("Tear the job down?")
    program.send(b"\x03")
    assert program.wait(60) == 130, program.text()


# -- srtr tui on a finished run: the post-mortem ---------------------------------------------


@pytest.fixture(scope="module")
def ended_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir whose job has ended (exit 3), to open with `srtr tui`."""
    root = tmp_path_factory.mktemp("ended")
    recipe = root / "ending.yaml"
    recipe.write_text(ENDING)
    run_dir = root / "run"
    done = subprocess.run(
        srtr("up", str(recipe), "--headless", "--run-dir", str(run_dir)),
        cwd=root,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    return run_dir


def test_srtr_tui_opens_a_finished_run_read_only(
    ended_run: Path, tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    run_dir = ended_run
    viewer = start(programs, srtr("tui", str(run_dir)), run_dir, tmp_path)
    screen = viewer.wait_for_text("the job has ended: read-only", "service_broken", "JobFailed")
    assert "Restart" not in footer(viewer) and "Teardown" not in footer(viewer), screen
    # The intent keys do nothing (no dialog); the help says why.
    viewer.send(b"rsT?")
    screen = viewer.wait_for_text("Read-only: the job has ended")
    assert "Restart service" not in screen and "Tear the job down?" not in screen, screen
    viewer.send(b"\x1b")
    gone(viewer, "Read-only: the job has ended")
    viewer.send(b"q")
    assert viewer.wait(30) == 0, viewer.text()


def test_a_run_whose_controller_died_opens_read_only_with_how_to_adopt(tmp_path: Path) -> None:
    run_dir = fake_run_dir(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = fake_state("Running")
    state["job"]["controller_pid"] = dead.pid
    (run_dir / "state.json").write_text(json.dumps(state))
    app = SrtrApp(run_dir, clock=lambda: NOW)

    async def scenario() -> None:
        async with app.run_test(size=(140, 45)) as pilot:
            await until(pilot, lambda: app.frames > 0, "the first frame")
            assert "controller is not running: read-only" in header_text(app)
            assert "--adopt" in header_text(app)
            assert not app.job_running
            await pilot.press("r")
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmModal)  # no intent offered

    asyncio.run(scenario())


# -- detach: the job goes on headless; srtr tui re-attaches ---------------------------------

HOLDING = textwrap.dedent(
    """\
    name: holding
    services:
      - name: train
        command: ["sleep", "infinity"]
        nodes: 2
        stop_grace_seconds: 5
      - name: watcher
        command: ["sleep", "infinity"]
        placement: {pool: train}
        stop_grace_seconds: 5
    """
)


def up_holding(tmp_path: Path, programs: list[tuple[PtyProgram, Path]]) -> tuple[PtyProgram, Path]:
    """`srtr up` of the holding job (it runs until stopped) on a pty; it and its run dir."""
    recipe = tmp_path / "holding.yaml"
    recipe.write_text(HOLDING)
    run_dir = tmp_path / "run"
    up = start(programs, srtr("up", str(recipe), "--run-dir", str(run_dir)), run_dir, tmp_path)
    return up, run_dir


def sighup_ignored(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as handle:
        line = next(x for x in handle if x.startswith("SigIgn:"))
    return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))


def test_detach_leaves_the_job_running_through_a_hang_up_and_srtr_tui_reattaches(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    up, run_dir = up_holding(tmp_path, programs)
    up.wait_for_text("service_watcher_node2", "Detach")
    wait_for(
        lambda: (s := read_state(run_dir)) and all(i["phase"] == "Running" for i in s["instances"]),
        30,
        "every instance to run",
    )
    up.send(b"d")
    # The note's last line: each of its lines is a write of its own to the terminal, and
    # a read may bring the first ones before the others are written.
    last = detach_lines(run_dir, up.proc.pid)[-1].encode()
    wait_for(lambda: (up.pump(), last in up.raw)[1], 30, "the whole detach note")
    printed = after_tui(up)
    assert f"re-attach:  srtr tui {run_dir}" in printed, printed
    assert "This terminal may be closed" in printed, printed
    # Headless now: SIGHUP is ignored, so closing the terminal leaves the job running.
    wait_for(lambda: sighup_ignored(up.proc.pid), 10, "SIGHUP to be ignored")
    up.hang_up()  # the kernel sends SIGHUP to the terminal's processes as it closes
    state = read_state(run_dir)
    assert state is not None and state["job"]["phase"] == "Running"
    # Re-attach from another terminal: the same job, and it can be driven.
    viewer = start(programs, srtr("tui", str(run_dir)), run_dir, tmp_path)
    viewer.wait_for_text("service_watcher_node2", "Running")
    assert up.proc.poll() is None, "the detached job ended with its terminal"
    viewer.send(b"T")
    viewer.wait_for_text("Tear the job down?")
    viewer.send(b"y")
    assert up.wait(60) == 143
    viewer.wait_for_text("the job has ended: read-only")
    viewer.send(b"q")
    assert viewer.wait(30) == 0
    # The job's progress went on into srtr.log while it ran headless.
    log = (run_dir / "logs" / "srtr.log").read_text()
    assert "TearingDown" in log and "JobFailed" in log


def the_tui_of(up: PtyProgram) -> int:
    """The pid of `srtr up`'s TUI: its own process, `srtr tui` with the private pipe."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == up.proc.pid and b"--up-fd" in argv:
            return int(entry)
    raise AssertionError("srtr up has no TUI process")


def niceness(pid: int, tid: int | None = None) -> int:
    where = f"/proc/{pid}" if tid is None else f"/proc/{pid}/task/{tid}"
    return int(Path(f"{where}/stat").read_text().rsplit(")", 1)[1].split()[16])


def thread_niceness(pid: int) -> dict[int, int]:
    """Each thread's niceness (a thread may end meanwhile: left out)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            out[int(tid)] = niceness(pid, int(tid))
    return out


def test_the_tui_is_a_process_of_its_own_and_its_death_tears_the_job_down(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    up, run_dir = up_holding(tmp_path, programs)
    up.wait_for_text("service_watcher_node2", "Running")
    tui = the_tui_of(up)
    assert tui != up.proc.pid
    # Its frames are up: it yields the CPU to the job (niceness +10 over srtr up's), its
    # own thread and the thread that reads the run dir for it (more than one thread).
    base = niceness(up.proc.pid)
    wait_for(lambda: list(thread_niceness(tui).values()).count(base + 10) >= 2, 30, "niced threads")
    assert niceness(tui, tui) == base + 10
    os.kill(tui, signal.SIGKILL)  # a TUI that crashed: the job must not go on unseen
    assert up.wait(60) == 143, up.text()
    assert "the TUI closed while the job runs; tearing it down" in up.raw.decode(errors="replace")
    state = read_state(run_dir)
    assert state is not None and state["job"]["phase"] in ("Failed", "Succeeded"), state["job"]


# -- themes: --theme, SRTR_THEME, and `c` -------------------------------------------------


def background_of(program: PtyProgram, word: str) -> str:
    for y, line in enumerate(program.screen.display):
        x = line.find(word)
        if x >= 0:
            return str(program.screen.buffer[y][x].bg)
    raise AssertionError(f"no {word!r} on screen:\n{program.text()}")


def test_themes_from_the_flag_the_environment_and_the_c_key(
    ended_run: Path, tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    dark = start(programs, srtr("tui", str(ended_run)), ended_run, tmp_path)
    dark.wait_for_text("JobFailed")
    dark_bg = background_of(dark, "JobFailed")
    dark.send(b"q")
    assert dark.wait(30) == 0

    light = start(programs, srtr("tui", str(ended_run), "--theme", "light"), ended_run, tmp_path)
    light.wait_for_text("JobFailed")
    light_bg = background_of(light, "JobFailed")
    assert light_bg != dark_bg
    # `c`: the next theme (light → terminal): the terminal's own background.
    light.send(b"c")
    wait_for(
        lambda: (light.pump(), background_of(light, "JobFailed") == "default")[1],
        30,
        "the terminal's own colours",
    )
    light.send(b"q")
    assert light.wait(30) == 0

    env = {"SRTR_THEME": "light"}
    from_env = start(programs, srtr("tui", str(ended_run)), ended_run, tmp_path, env=env)
    from_env.wait_for_text("JobFailed")
    assert background_of(from_env, "JobFailed") == light_bg
    from_env.send(b"q")
    assert from_env.wait(30) == 0

    bad = subprocess.run(
        srtr("tui", str(ended_run)),
        env={**os.environ, "SRTR_THEME": "neon"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "SRTR_THEME: unknown theme 'neon'; use dark, light, terminal" in bad.stderr


# -- the help lists every key; docs/cli.md too ------------------------------------------------


def every_binding() -> list[tuple[str, Any]]:
    """(class name, Binding) of the App and of every widget and screen of srtr.tui."""
    import importlib
    import pkgutil

    from textual.binding import Binding

    import srtr.tui.widgets

    classes: list[type] = [SrtrApp]
    for info in pkgutil.iter_modules(srtr.tui.widgets.__path__):
        module = importlib.import_module(f"srtr.tui.widgets.{info.name}")
        classes += [c for c in vars(module).values() if isinstance(c, type)]
    found = []
    for cls in classes:
        if cls.__module__.startswith("srtr.tui") and "BINDINGS" in vars(cls):
            found += [(cls.__name__, b) for b in vars(cls)["BINDINGS"] if isinstance(b, Binding)]
    return found


def test_the_help_lists_every_key_of_every_widget_and_docs_list_them_too() -> None:
    from srtr.tui import keys

    listed = keys.help_keys(SrtrApp.BINDINGS, SrtrApp.OTHER_KEYS)
    shown = {key for key, _ in listed}
    bindings = every_binding()
    assert {name for name, _ in bindings} >= {"SrtrApp", "InstancesTable", "ConfirmModal"}
    for owner, binding in bindings:
        if owner == "SrtrApp" and binding.key in ("escape", "ctrl+q"):
            continue  # Esc has its own line; Ctrl+Q is q
        assert (binding.key_display or binding.key) in shown, (owner, binding)
    assert {"d", "c"} <= shown  # detach and the theme
    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    for key, description in listed:
        assert f"| `{key}` | {description} |" in docs, key


# -- layouts: 80x24, and 8 nodes x 4 riders ----------------------------------------------------

FLEET = textwrap.dedent(
    """\
    name: fleet
    services:
      - name: trainer_with_a_long_name
        command: ["sleep", "infinity"]
        nodes: 8
        stop_grace_seconds: 2
      - name: watcher
        command: ["sleep", "infinity"]
        placement: {pool: trainer_with_a_long_name}
        stop_grace_seconds: 2
      - name: metrics_exporter
        command: ["sleep", "infinity"]
        placement: {pool: trainer_with_a_long_name}
        stop_grace_seconds: 2
      - name: log_shipper_daemon
        command: ["sleep", "infinity"]
        placement: {pool: trainer_with_a_long_name}
        stop_grace_seconds: 2
      - name: flaky
        command: ["bash", "-c", "exit 7"]
        placement: {pool: trainer_with_a_long_name}
        restart: never
        stop_grace_seconds: 2
    """
)


def fleet(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]], columns: int, lines: int
) -> PtyProgram:
    recipe = tmp_path / "fleet.yaml"
    recipe.write_text(FLEET)
    run_dir = tmp_path / "run"
    argv = srtr("up", str(recipe), "--run-dir", str(run_dir))
    program = start(programs, argv, run_dir, tmp_path, columns=columns, lines=lines)
    wait_for(
        lambda: (
            (s := read_state(run_dir)) and sum(i["phase"] == "Failed" for i in s["instances"]) == 8
        ),
        60,
        "the eight flaky riders to fail",
    )
    return program


def stop(program: PtyProgram) -> None:
    program.send(b"\x03")
    program.wait_for_text("Tear the job down?")
    program.send(b"\x03")
    assert program.wait(60) == 130, program.text()


def test_at_80x24_the_side_panes_fold_and_name_phase_ready_stay(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    program = fleet(tmp_path, programs, 80, 24)
    program.wait_for_text("service_train…ong_name_node1", "Running")
    # The needles may show before the rest of the frame that brings them is read: the
    # rows are looked at once the screen has every row whole (or not, after a while).
    deadline = time.monotonic() + 30
    while not _rows_whole(program.screen.display) and time.monotonic() < deadline:
        program.pump()
    screen = program.text()
    assert "╭─ pools" not in screen and "╭─ nodes" not in screen, screen
    heading = next(line for line in program.screen.display if "NAME" in line and "PHASE" in line)
    assert "READY" in heading, screen
    rows = [line for line in program.screen.display if "…ong_name_node" in line]
    assert rows, screen
    for row in rows:  # the name is cut in the middle, PHASE and READY are on screen
        assert re.search(ROW_80, row), row
    stop(program)


ROW_80 = r"service_train…ong_name_node\d +[A-Z][A-Za-z]+ +(yes|no) "


def _rows_whole(display: list[str]) -> bool:
    rows = [line for line in display if "…ong_name_node" in line]
    return bool(rows) and all(re.search(ROW_80, row) for row in rows)


def test_the_node_grid_has_a_column_per_rider_abbreviated_and_failures_filled(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    program = fleet(tmp_path, programs, 200, 50)
    screen = program.wait_for_text("METRICS…", "LOG_SHI…", "FLAKY", "node8", "✗ Failed")
    heading = next(line for line in program.screen.display if "METRICS…" in line)
    for label in ("NODE", "ROLE", "OWNER", "WATCHER", "METRICS…", "LOG_SHI…", "FLAKY"):
        assert label in heading, heading
    assert "trainer_w…" in screen  # the pool's name in ROLE, cut

    def grid_rows() -> list[int]:
        program.pump()
        return [y for y, line in enumerate(program.screen.display) if line.startswith("│ node")]

    wait_for(
        lambda: (
            len(rows := grid_rows()) == 8
            and all("✗ Failed" in program.screen.display[y] for y in rows)
        ),
        30,
        "eight grid rows with a failed FLAKY cell",
    )
    flaky_x = heading.index("FLAKY")
    for y in grid_rows():
        cell = program.screen.buffer[y][flaky_x + 2]  # in "✗ Failed"
        assert program.screen.display[y][flaky_x : flaky_x + 8] == "✗ Failed", screen
        assert cell.reverse, f"the failed cell of row {y} is not filled"
        assert not program.screen.buffer[y][heading.index("WATCHER") + 2].reverse
    stop(program)


# -- reasons longer than 12 characters keep the columns ---------------------------------------


def test_long_event_reasons_keep_the_progress_columns(tmp_path: Path) -> None:
    from srtr.runtime.control import send
    from tests.support.e2e_util import Run

    run = Run(tmp_path, HOLDING)
    try:
        state = run.wait_state(
            lambda s: all(i["phase"] == "Running" for i in s["instances"]), what="running"
        )
        watcher = "service_watcher_node1"
        before = next(i["pid"] for i in state["instances"] if i["name"] == watcher)
        send(run.run_dir, "restart", watcher)  # RestartRequested: 16 letters
        # A user's restart is planned: it counts no RESTARTS, but a new process runs.
        run.wait_state(
            lambda s: any(
                i["name"] == watcher and i["phase"] == "Running" and i["pid"] not in (None, before)
                for i in s["instances"]
            ),
            what="the restart",
        )
        send(run.run_dir, "teardown")
        assert run.finish() == 143
    finally:
        run.close()
    text = run.out
    lines = [line for line in text.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert any(" RestartRequested " in line for line in lines), text
    starts = {re.match(r"\S+ \S+ +", line).end() for line in lines}  # type: ignore[union-attr]
    assert starts == {9 + 16 + 1}, [line for line in lines if len(line) > 30][:5]


def test_the_node_grid_scrolls_sideways_to_riders_that_do_not_fit(tmp_path: Path) -> None:
    from srtr.tui.widgets.node_grid import NodeGridTable

    state = fake_state("Running")
    for rider in ("metrics_exporter", "log_shipper_daemon", "flaky"):
        state["pools"][0]["riders"].append(rider)
        for node, ip in (("node2", "127.0.0.3"), ("node3", "127.0.0.4")):
            state["instances"].append(
                {
                    **state["instances"][3],
                    "name": f"service_{rider}_{node}",
                    "service": rider,
                    "node": node,
                    "node_ip": ip,
                    "phase": "Failed" if rider == "flaky" else "Running",
                }
            )
    run_dir = fake_run_dir(tmp_path)
    (run_dir / "state.json").write_text(json.dumps(state))
    app = SrtrApp(run_dir, clock=lambda: NOW, check_controller=False)

    async def scenario() -> None:
        async with app.run_test(size=(140, 45)) as pilot:
            await until(pilot, lambda: app.frames > 0, "the first frame")
            grid = app.query_one(NodeGridTable)
            assert [str(c.label) for c in grid.columns][-3:] == [
                "METRICS…",
                "LOG_SHI…",
                "FLAKY",
            ]
            await until(
                pilot,
                lambda: grid.virtual_size.width > grid.size.width > 0,
                "a grid wider than its pane",
            )
            grid.focus()
            await pilot.press(*["right"] * 8)
            await until(pilot, lambda: grid.scroll_x > 0, "the grid to scroll sideways")

    asyncio.run(scenario())
