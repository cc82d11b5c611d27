"""How `srtr up` runs a job, besides what to run and where: the assembly fills these in, the
lifecycle and its side tasks read them (a module of its own, so that neither imports the
other for it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srtr.backends.local.loopback import LoopbackBlock
from srtr.backends.provision import Provisioner
from srtr.net import certs
from srtr.resources.pins import Pins
from srtr.runtime import guard


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """How `srtr up` runs a job, besides what to run and where.

    progress: one line per event on stdout (headless).
    recipe: the file whose saves are live edits (None: no watching); recipe_text is what
        was planned, allocation the (node, ip) pairs it was planned on.
    apply_auto: apply live edits at once, or hold them for a yes (TUI).
    adopt_from: the state.json of a crashed controller's job, to take it over.
    metrics_listen: (host, port) to serve srtr's own metrics on.
    launcher: how the backend starts instances (process, step, agent), for state.json.
    early_guard: the job's guard when `srtr up` started it before the job (at salloc time);
        None: the lifecycle starts it.
    source_pins: the job's source pins (resources/pins.py), for every later planning.
    cert: the job's TLS certificate (`net.certs`), which the agent channel presents
        too; None: the control channel makes one.
    provisioner: where live edits get nodes beyond the allocation (`backends.provision`),
        the backend then `grow.Growable`; None: such an edit is refused.
    provisioned: the allocation's nodes that came from a grow request (adoption).
    no_grow: why a live edit cannot grow a pool past the allocation (no provisioner), for
        its refusal; "" says nothing more than the numbers.
    network: a local job's loopback block (`backends.local.loopback`): recorded in
        state.json, and held by the guard too, so that it stays the job's while the job can
        be adopted.
    """

    progress: bool = True
    slurm_job_id: str | None = None
    recipe: Path | None = None
    recipe_text: str = ""
    allocation: Sequence[tuple[str, str]] = ()
    apply_auto: bool = True
    watch_poll: bool | None = None
    adopt_from: dict[str, Any] | None = None
    adopt_window: float = guard.ADOPT_WINDOW
    metrics_listen: tuple[str, int] | None = None
    launcher: str = ""
    early_guard: guard.Started | None = None
    source_pins: Pins = dataclasses.field(default_factory=dict)
    cert: certs.JobCert | None = None
    provisioner: Provisioner | None = None
    provisioned: Sequence[str] = ()
    no_grow: str = ""
    network: LoopbackBlock | None = None
