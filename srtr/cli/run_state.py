"""A run dir's state as the verbs that look at one read it: `status`, `logs`, `tui`,
`down`, `restart`, `stop`, and `up` on a run dir it is asked to reuse or adopt.

Shared here, apart from any verb, so that verb modules import it and never each other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from srtr.cli.errors import bad

if TYPE_CHECKING:
    from srtr.runtime.liveness import Liveness
    from srtr.store.rundir import RunState


def read_run(run_dir: Path, reader: Callable[[Path], RunState] | None = None) -> RunState:
    """`run_dir`'s state.json (read by `reader`, else `read_state`). Raises RecipeError
    (exit 2) when it cannot be read."""
    from srtr.store.rundir import StateFileError, read_state

    try:
        return (reader or read_state)(run_dir)
    except StateFileError as exc:
        if exc.missing:
            raise bad(str(run_dir), "no state.json here; is this a run dir of `srtr up`?") from None
        if exc.foreign:
            raise bad(str(exc.path), "not an srtr state file") from None
        raise bad(str(exc.path), f"cannot read the state file: {exc}") from None


def check_liveness(run_dir: Path, state: RunState, *, slurm: bool = True) -> Liveness:
    """Whether the job's controller runs: its heartbeat and SLURM's word, never a pid."""
    from srtr.runtime.liveness import check

    return check(run_dir, state, slurm=slurm)
