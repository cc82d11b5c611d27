"""`srtr up` under the TUI: the job's first failure is selected at the end and printed after.

A TUI test on a pty: run under the e2e lock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.local.test_causes import RANKS
from tests.support.pty_util import PtyProgram
from tests.tui.test_screens import after_tui, programs, srtr, start

pytestmark = pytest.mark.e2e

__all__ = ["programs"]  # the fixture, used by name


def test_the_end_selects_and_prints_the_first_failed_rank(
    tmp_path: Path, programs: list[tuple[PtyProgram, Path]]
) -> None:
    recipe = tmp_path / "ranks.yaml"
    recipe.write_text(RANKS)
    run_dir = tmp_path / "run"
    program = start(programs, srtr("up", str(recipe), "--run-dir", str(run_dir)), run_dir, tmp_path)
    program.wait_for_text("closing in 3s")
    screen = program.wait_for_text("closing in 2s")  # the final state is on screen by now
    # Not the first Failed rank in state order (node1, 134): the one that failed first.
    assert "╭─ service_train_node3" in screen, screen
    assert program.wait(30) == 1, program.text()
    program.pump(0.2)
    printed = after_tui(program)
    assert "first failure: service_train_node3 on node3 at " in printed, printed
    assert "  | rank 2: CUDA error: an illegal memory access was encountered" in printed
