"""What the user asked `srtr up` (or `srtr submit`) for, typed: the CLI builds a `JobRequest`
from its arguments, and `runtime.assembly` makes the job of it. Plain data, so that nothing
below the CLI reads an argparse namespace and a new flag is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from srtr.resources.objects import DesiredState


class SlurmResources(Protocol):
    """The recipe's defaults for the SLURM flags (`resources.*` of a recipe)."""

    @property
    def partition(self) -> str | None: ...

    @property
    def account(self) -> str | None: ...

    @property
    def time_limit(self) -> str | None: ...


class PlanWatcher(Protocol):
    """Told when a new job starts planning and what it planned: the TUI of `srtr up` starts
    beside the plan and shows it until the job's first state.json."""

    def planning(self) -> None: ...

    def planned(self, desired: DesiredState, backend: str, slurm_job_id: str | None) -> None: ...


@dataclass(frozen=True)
class SlurmFlags:
    """--partition, --account and --time as given (None: the recipe's `resources.*`)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None

    def over(self, res: SlurmResources) -> SlurmFlags:
        """These flags, each one not given taken from the recipe's resources."""
        return SlurmFlags(
            self.partition or res.partition,
            self.account or res.account,
            self.time or res.time_limit,
        )


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """How to run a job.

    recipe: the recipe file as given (adopting: None takes the crashed job's own).
    run_dir: where the job's files go (refused already if another run holds it).
    backend: auto, local or slurm (auto: slurm inside an allocation, local otherwise).
    launcher: auto, process, step or agent.
    nodes: nodes to simulate or allocate (None: what the recipe needs).
    adopt_window: how long instances outlive a crashed controller, waiting for adoption.
    watch: take saves of the recipe file as live edits; watch_poll: poll it for them.
    apply: auto or confirm, for live edits (None: confirm in the TUI, auto otherwise).
    metrics_listen: (host, port) to serve srtr's own metrics on; the host is
        --metrics-address, else the port's HOST:, else loopback (no authentication).
    hollow: one process simulates every node's agent (a testing and benchmark tool).
    tui: the TUI shows the job (no progress lines on stdout).
    plan_watcher: told when a new job plans, and what it planned (the TUI's first frame).
    """

    recipe: str | None
    run_dir: Path
    backend: str = "auto"
    launcher: str = "auto"
    nodes: int | None = None
    slurm: SlurmFlags = SlurmFlags()
    adopt_window: float = 60.0
    watch: bool = True
    watch_poll: bool = False
    apply: str | None = None
    metrics_listen: tuple[str, int] | None = None
    hollow: bool = False
    tui: bool = False
    plan_watcher: PlanWatcher | None = None

    def apply_auto(self) -> bool:
        """Whether live edits apply at once (else after a yes in the TUI)."""
        return (self.apply or ("confirm" if self.tui else "auto")) == "auto"
