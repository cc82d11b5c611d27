"""The path a new user takes (issue 12): the wheel `pip install .` builds, in a fresh venv,
the README's first command, and the TUI on a real pseudo-terminal that can go away.

Nothing here imports srtr from the source tree: every command runs the venv's `srtr`, from
a directory outside the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e_util import processes_with, read_state, wait_for
from tests.support.pty_util import PtyProgram

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]

# The seed's pools recipe without its benchmark: the job holds until it is stopped, so the
# TUI stays up while the test looks at it.
HOLDING_POOLS = textwrap.dedent(
    """\
    roles:
      agg: {nodes: 1, workers: 1, gpus: 8}
    services:
      - name: train
        type: generic
        command: ["sleep", "infinity"]
        nodes: 2
      - name: napper
        type: generic
        command: ["sleep", "infinity"]
        nodes: 1
      - name: watcher
        type: generic
        command: ["sleep", "infinity"]
        placement: {pool: train}
    """
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("srtr-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system site-packages) with the wheel installed, not editable."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=True)
    subprocess.run(
        [str(home / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        timeout=600,
        env=user_env(home),  # no PYTHONPATH: pip must not see a checkout's srtr
    )
    return home


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A working directory outside the checkout, so `srtr` cannot come from the source tree."""
    where = tmp_path / "cwd"
    where.mkdir()
    return where


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{home / 'bin'}:{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(home)
    return env


def test_the_wheel_ships_every_file_of_the_package(wheel: Path) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "srtr"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "srtr/tui/app.tcss" in tracked
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [path for path in tracked if path not in names]
    assert not missing, f"not in {wheel.name}: {missing}"


def test_srtr_runs_from_the_installed_wheel(installed: Path, outside: Path) -> None:
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import srtr; print(srtr.__file__)"],
        cwd=outside,
        capture_output=True,
        text=True,
        check=True,
        env=user_env(installed),
    ).stdout.strip()
    assert where.startswith(str(installed)), where


def test_the_readme_first_command_runs_headless(installed: Path, outside: Path) -> None:
    run_dir = outside / "run"
    done = subprocess.run(
        [
            str(installed / "bin" / "srtr"),
            "up",
            str(ROOT / "examples" / "pools.yaml"),
            "--headless",
            "--run-dir",
            str(run_dir),
        ],
        cwd=outside,
        capture_output=True,
        text=True,
        timeout=120,
        env=user_env(installed),
    )
    assert done.returncode == 0, done.stderr
    assert "train pool: node2,node3" in (run_dir / "logs" / "benchmark.out").read_text()
    state = read_state(run_dir)
    assert state is not None and state["job"]["phase"] == "Succeeded"


@pytest.fixture()
def tui(installed: Path, outside: Path) -> Iterator[tuple[PtyProgram, Path]]:
    recipe = outside / "pools.yaml"
    recipe.write_text(HOLDING_POOLS)
    run_dir = outside / "run"
    program = PtyProgram(
        [str(installed / "bin" / "srtr"), "up", str(recipe), "--run-dir", str(run_dir)],
        cwd=outside,
        env=user_env(installed),
    )
    try:
        yield program, run_dir
    finally:
        program.kill()
        marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0"
        wait_for(lambda: not processes_with(marker), 30, "the run's processes to be gone")


def nothing_left(run_dir: Path) -> None:
    marker = f"SRTR_RUN_DIR={run_dir.resolve()}\0"
    wait_for(lambda: not processes_with(marker), 10, "every process of the run to be gone")
    state = read_state(run_dir)
    assert state is not None
    assert all(i["pid"] is None or i["phase"] != "Running" for i in state["instances"])


def test_the_tui_shows_the_pools_help_and_ctrl_c_twice_exits_130(
    tui: tuple[PtyProgram, Path],
) -> None:
    program, run_dir = tui
    program.wait_for_text("train", "napper", "watcher", "service_train_node2")
    program.send(b"?")
    program.wait_for_text("Ctrl+C")  # the help screen lists the keys
    program.send(b"\x1b")  # close the help
    program.wait_for_text("service_train_node2")
    program.send(b"\x03")
    program.wait_for_text("Tear the job down?")
    program.send(b"\x03")
    assert program.wait(60) == 130, program.text()
    nothing_left(run_dir)
    state = read_state(run_dir)
    assert state is not None and state["job"]["exit_code"] == 130


def test_closing_the_terminal_ends_srtr_up_with_129(tui: tuple[PtyProgram, Path]) -> None:
    program, run_dir = tui
    program.wait_for_text("service_watcher_node3")
    wait_for(
        lambda: (s := read_state(run_dir)) and all(i["pid"] for i in s["instances"]),
        30,
        "every instance to run",
    )
    program.hang_up()
    # `sleep` ends on SIGTERM, so a graceful teardown fits well inside the 10 s allowed.
    assert program.wait(10) == 129
    nothing_left(run_dir)
    state = read_state(run_dir)
    assert state is not None
    assert state["job"]["phase"] == "Failed" and state["job"]["exit_code"] == 129


def test_closing_the_terminal_of_srtr_tui_leaves_the_job_running(
    installed: Path, outside: Path
) -> None:
    """`srtr tui RUN_DIR` is only a viewer: when its terminal goes away it leaves, and the
    job it watched goes on (it ends with its own `srtr up`)."""
    recipe = outside / "pools.yaml"
    recipe.write_text(HOLDING_POOLS)
    run_dir = outside / "run"
    env = user_env(installed)
    job = subprocess.Popen(
        [
            str(installed / "bin" / "srtr"),
            "up",
            str(recipe),
            "--headless",
            "--run-dir",
            str(run_dir),
        ],
        cwd=outside,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    viewer: PtyProgram | None = None
    try:
        wait_for(lambda: (s := read_state(run_dir)) and s["job"]["phase"] == "Running", 30)
        viewer = PtyProgram(
            [str(installed / "bin" / "srtr"), "tui", str(run_dir)], cwd=outside, env=env
        )
        viewer.wait_for_text("service_train_node2")
        viewer.hang_up()
        viewer.wait(10)
        state = read_state(run_dir)
        assert job.poll() is None and state is not None and state["job"]["phase"] == "Running"
        job.terminate()
        assert job.wait(30) == 143
    finally:
        if viewer is not None:
            viewer.kill()
        if job.poll() is None:
            job.kill()
            job.wait(10)
    nothing_left(run_dir)


def test_a_headless_job_whose_stdout_pipe_closes_tears_down_quietly_with_141(
    tmp_path: Path,
) -> None:
    """`srtr up --headless | head -3`: stdout can no longer be written (issue 12). A pipe
    whose reader left is SIGPIPE, as for any CLI, not a hang-up (issue 23): 141, quietly."""
    recipe = tmp_path / "pools.yaml"
    recipe.write_text(HOLDING_POOLS)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "srtr", "up", str(recipe), "--headless", "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        wait_for(lambda: (s := read_state(run_dir)) and s["job"]["phase"] == "Running", 30)
        proc.stdout.readline()
        proc.stdout.close()  # the reader leaves: the next progress line meets EPIPE
        # Something must be printed for the loss to show: ask for a restart (an event).
        from srtr.runtime.control import send

        send(run_dir, "restart", "service_napper")
        assert proc.wait(10) == 141
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    nothing_left(run_dir)
    state = read_state(run_dir)
    assert state is not None and state["job"]["exit_code"] == 141
    assert state["job"]["reason"] == "stdout closed (SIGPIPE)"
