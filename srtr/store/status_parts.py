"""Typed status of the job's parts besides instances: pools, live edits, growth, exporters,
replacement fences and fleet gates.

Plain data, like `status.py`: the store holds one field of each (`StoreBase`), controllers
read and write them, and `persist.py` builds state.json's sections from them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from srtr.resources.diff import Plan
from srtr.resources.errors import GrowRequired
from srtr.resources.objects import DesiredState, ExporterSpec
from srtr.resources.recipe import Autoscale

# -- pools ---------------------------------------------------------------------------------


@dataclass
class AutoscaleStatus:
    """An autoscaled pool: its bounds and size, and what its publisher last said.

    `source`, `desired` and `error` appear in state.json once known: the URL once instance 0
    is ready, the count once read, the error once any read was made (null after a good one).
    """

    min: int
    max: int
    size: int
    source: str | None = None
    desired: int | None = None
    error: str | None = None
    read: bool = False  # a read has ended (so `error` is shown, null or not)
    due: float = 0.0  # monotonic: when the next read is due
    in_flight: bool = False
    last_change: float | None = None  # monotonic: the last change of size (cooldown)
    failed: str | None = None  # the read failure last reported (one event per distinct one)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"min": self.min, "max": self.max, "size": self.size}
        if self.source is not None:
            doc["source"] = self.source
        if self.desired is not None:
            doc["desired"] = self.desired
        if self.read:
            doc["error"] = self.error
        return doc


@dataclass
class PoolStatus:
    """A pool: whether every owner is ready, what it waits for (the provider's word for a
    grow request, None: nothing), and its autoscaling when it has any."""

    ready: bool = False
    pending: str | None = None
    autoscale: AutoscaleStatus | None = None


# -- live edits ----------------------------------------------------------------------------


class RecipeOutcome(enum.Enum):
    """What became of the last saved edit (state.json's `recipe`)."""

    NONE = "none"  # no edit yet: `{}`
    IN_SYNC = "in-sync"
    PENDING = "pending"
    REJECTED = "rejected"
    DISCARDED = "discarded"
    APPLIED = "applied"


@dataclass
class RecipeStatus:
    """Live edits: the applied text, the latest saved text, and what became of it.

    `saved`/`unreadable` are written by the recipe watcher; the `recipe` reconcile plans
    what was saved. `sizes` are autoscaled pools' sizes now, which every planning applies.
    """

    text: str = ""  # the applied recipe's text
    path: str = "recipe.yaml"  # the watched file, as error messages name it
    saved: str | None = None  # the file's latest text, None: not read yet
    unreadable: list[str] | None = None  # why the latest read failed (`file:line: ...`)
    planned: str | None = None  # the last saved text that was planned
    replan: bool = False  # plan the text again even if unchanged (nodes joined, a scale)
    pinning: bool = False  # the sources of services an edit adds are being pinned
    auto: bool = True  # apply at once, or hold for the user's yes
    no_grow: str = ""  # why nothing grows here, for refusals
    sizes: dict[str, int] = field(default_factory=dict)
    pending: tuple[DesiredState, Plan, str] | None = None
    outcome: RecipeOutcome = RecipeOutcome.NONE
    plan: Plan | None = None  # the outcome's plan (pending, applied, or rejected)
    rejected: list[str] | None = None
    discarded: str | None = None
    # The applied text's autoscaled pools, worked out once per text.
    scaled: tuple[str, dict[str, Autoscale]] = ("", {})

    def to_json(self) -> dict[str, Any]:
        """state.json's `recipe`."""
        outcome, plan = self.outcome, self.plan
        if outcome is RecipeOutcome.NONE:
            return {}
        doc: dict[str, Any] = {"pending": None, "rejected": None}
        if outcome is RecipeOutcome.PENDING and plan is not None:
            doc["pending"] = plan.to_json()
        elif outcome is RecipeOutcome.REJECTED:
            doc["rejected"] = self.rejected
            doc["plan"] = plan.to_json() if plan else None
        elif outcome is RecipeOutcome.DISCARDED:
            doc["discarded"] = self.discarded
        elif outcome is RecipeOutcome.APPLIED and plan is not None:
            doc["applied"] = plan.to_json()
        return doc


# -- growth --------------------------------------------------------------------------------


class RequestView(Protocol):
    """A grow request as its provider last described it (`backends.provision.RequestState`)."""

    def to_json(self) -> dict[str, object]: ...


@dataclass
class GrowStatus:
    """Growing past the allocation: the provider, the nodes, and the request in flight.

    `nodes` is the allocation in order as the live-edit planner sees it, `provisioned` the
    names among them that came from a grow request.
    """

    provider: str = ""
    noun: str = "request"
    enabled: bool = False  # a provider can bring nodes (else such an edit is refused)
    nodes: list[tuple[str, str]] = field(default_factory=list)
    provisioned: frozenset[str] = frozenset()
    wanted: GrowRequired | None = None
    request: str | None = None  # id of the one request in flight
    reason: str = ""  # the provider's word on it when last looked at
    joined: set[str] = field(default_factory=set)  # requests whose nodes joined
    requests: Sequence[RequestView] = ()  # every request of the run, as last known

    def add(self, nodes: Sequence[tuple[str, str]]) -> None:
        self.nodes += list(nodes)
        self.provisioned |= {name for name, _ in nodes}

    def remove(self, names: Sequence[str]) -> None:
        self.nodes = [n for n in self.nodes if n[0] not in set(names)]
        self.provisioned -= set(names)

    def to_json(self) -> dict[str, object]:
        """state.json's `grow`: every request of the run as last known."""
        return {
            "provider": self.provider,
            "provisioned": sorted(self.provisioned),
            "requests": [r.to_json() for r in self.requests],
        }


# -- exporters -----------------------------------------------------------------------------

Scrape = Callable[[ExporterSpec, float], Awaitable[tuple[bool, str]]]


@dataclass
class Health:
    """What the last scrape of one target said; `up` is None until scraped while listed."""

    up: bool | None = None
    last_error: str | None = None
    last_scrape: float | None = None  # wall clock, for readers
    next_at: float = 0.0  # monotonic; 0: scrape as soon as listed
    listed_at: float | None = None  # monotonic; None while not in the targets file
    in_flight: bool = False


@dataclass
class ExporterStatus:
    """The exporter controller's job-wide state: what the targets file lists, and health.

    `text` is the targets file as it should read; the targets-file writer (a side task)
    writes it and reports back with `written`.
    """

    scrape: Scrape | None = None  # None: the prober's HTTP GET (`ctx.prober.scrape`)
    interval: float = 15.0
    timeout: float = 2.0
    grace: float = 10.0
    retry: float = 0.5
    found: dict[tuple[str, str], bool] = field(default_factory=dict)  # program → present
    listed: tuple[ExporterSpec, ...] = ()
    listed_set: frozenset[ExporterSpec] = frozenset()
    text: str | None = None  # what the targets file should hold (None: no file)
    written: str | None = None  # what it holds, as last written
    writes: int = 0
    last_write: float | None = None
    health: dict[ExporterSpec, Health] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    run_files: set[str] = field(default_factory=set)  # kind run files written (run-dir paths)
    limit: asyncio.Semaphore | None = None


# -- replacement and fleet gates -------------------------------------------------------------


@dataclass
class ReplacementFence:
    """Lost instances that may still run on a cut-off node: until when (monotonic), and
    which of them the wait was recorded for (once each)."""

    until: dict[str, float] = field(default_factory=dict)
    told: set[str] = field(default_factory=set)


@dataclass
class FleetStatus:
    opened_at: float | None = None  # when every member was ready (monotonic)
    alive: int | None = None  # live members at the last answer; None: no answer yet
    message: str = ""  # what the last poll saw
    polled_at: float | None = None
    in_flight: bool = False
    passed: bool = False
