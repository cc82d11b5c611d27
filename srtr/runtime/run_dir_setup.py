"""A new run's run dir: made owner-only, with the files of an ended run there set aside.

Light on purpose (no srtr imports at module level): the CLI's parsers name `PREVIOUS_RUNS`
in a help text, and every verb builds those parsers.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Where --reuse-run-dir moves the files of the run dir's earlier runs: RUN_DIR/previous/N.
PREVIOUS_RUNS = "previous"


def set_aside(run_dir: Path) -> Path | None:
    """Move the files of the ended run in `run_dir` into `previous/N`: the new run starts
    clean, and nothing of the old one (its logs above all) is truncated or lost."""
    from srtr.store.rundir import STATE_FILE

    if not (run_dir / STATE_FILE).exists():
        return None
    previous = run_dir / PREVIOUS_RUNS
    previous.mkdir(exist_ok=True, mode=0o700)
    taken = {int(p.name) for p in previous.iterdir() if p.name.isdigit()}
    target = previous / str(max(taken, default=0) + 1)
    target.mkdir(mode=0o700)
    for entry in run_dir.iterdir():
        if entry.name != PREVIOUS_RUNS:
            entry.rename(target / entry.name)
    print(f"srtr: moved the previous run's files to {target}", file=sys.stderr)
    return target


def create_run_dir(run_dir: Path) -> Path:
    """Make `run_dir` and its logs/; the caller has refused a run dir that holds another
    run unless --reuse-run-dir said to set that one aside."""
    # The run dir holds env values (recipe.yaml, state.json): only its owner may read it.
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    set_aside(run_dir)
    run_dir.chmod(0o700)
    (run_dir / "logs").mkdir(exist_ok=True)
    return run_dir
