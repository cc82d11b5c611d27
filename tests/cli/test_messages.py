"""What the CLI says when used wrongly or cut short (issue 23, items 8 and 14): real `srtr`
processes on the local backend.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, wait_for

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def srtr(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def test_an_unknown_flag_prints_the_verbs_usage_and_a_suggestion() -> None:
    done = srtr("up", "--hedless", "examples/pools.yaml")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: srtr up ")
    assert "srtr up: error: unrecognized arguments: --hedless (did you mean '--headless'?)" in (
        done.stderr
    )
    done = srtr("status", "--wacth", "outputs/x")
    assert done.returncode == 2 and "usage: srtr status" in done.stderr
    assert "(did you mean '--watch'?)" in done.stderr


def test_an_unknown_verb_gets_a_suggestion() -> None:
    done = srtr("stauts", "outputs/x")
    assert done.returncode == 2
    assert "invalid choice: 'stauts'" in done.stderr
    assert "(did you mean 'status'?)" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [("plan", "examples/pools.yaml"), ("schema",), ("plan", "-o", "json", "examples/pools.yaml")],
)
def test_a_closed_stdout_pipe_exits_quietly_with_141(argv: tuple[str, ...]) -> None:
    """`srtr plan x | head -1`: the reader left, which is SIGPIPE's 141, with no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "srtr", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141
    assert err == ""


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_plan_process_prints_all_of_the_plan(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`srtr plan` ends its process without the interpreter's teardown (cli._exit_now):
    what it printed to stdout and stderr, and its exit code, are still main()'s, for a
    plan of 5,000 lines as for a recipe with a mistake."""
    from srtr.cli import main

    big = tmp_path / "big.yaml"
    big.write_text(
        "name: big\nservices:\n  - name: pool\n    command: [sleep, '{index}']\n"
        "    nodes: 1000\n  - name: rider\n    command: [echo, '{node_ip}']\n"
        "    placement: {pool: pool}\n"
    )
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("name: wrong\nservices:\n  - name: a\n    comand: [sleep, 1]\n")
    for recipe, code in ((ROOT / "examples" / "pools.yaml", 0), (big, 0), (wrong, 2)):
        argv = ("plan", str(recipe), "-o", output)
        done = srtr(*argv)
        assert main(list(argv)) == code == done.returncode
        captured = capsys.readouterr()
        assert (done.stdout, done.stderr) == (captured.out, captured.err)
        assert done.stdout if code == 0 else done.stderr


def test_status_into_a_closed_pipe_exits_quietly_with_141(tmp_path: Path) -> None:
    run = Run(tmp_path, (ROOT / "examples" / "pools.yaml").read_text())
    assert run.finish() == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "srtr", "status", str(run.run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and err == ""


def _without_slurm() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = "/nonexistent"  # no salloc, no sbatch (the interpreter is given by path)
    return env


def test_up_on_slurm_without_salloc_says_so_and_exits_2(tmp_path: Path) -> None:
    done = srtr(
        "up",
        "examples/pools.yaml",
        "--backend",
        "slurm",
        "--headless",
        "--run-dir",
        str(tmp_path / "run"),
        env=_without_slurm(),
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "slurm: salloc not found: is SLURM installed? (use --backend local)"
    )


def test_submit_without_sbatch_says_where_the_script_is(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = srtr("submit", "examples/pools.yaml", "--run-dir", str(run_dir), env=_without_slurm())
    assert done.returncode == 2
    script = run_dir.resolve() / "submit.sh"
    assert script.exists()
    assert f"the batch script is {script}: submit it with `sbatch {script}`" in done.stderr


STUBBORN = """
name: stubborn
services:
  - name: deaf
    command: ["bash", "-c", "trap '' TERM; echo up; while true; do sleep 0.2; done"]
    stop_grace_seconds: 600
"""


def test_the_first_ctrl_c_says_that_a_second_one_kills_now(tmp_path: Path) -> None:
    run = Run(tmp_path, textwrap.dedent(STUBBORN))
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", 30, "running")
        run.signal(signal.SIGINT)
        wait_for(
            lambda: "Ctrl+C again kills everything now" in run.stderr_so_far(),
            30,
            "the hint on stderr",
        )
        # The instance ignores SIGTERM with a 600 s grace: only the second Ctrl+C ends it.
        run.signal(signal.SIGINT)
        assert run.finish(timeout=60) == 130
    finally:
        run.close()
