"""What every reconcile function gets: the store, a backend, a clock, the queue, a prober.

Controllers import only this, the store and `backends.base`; the real backend and prober are
chosen by the CLI, and tests pass fakes.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from srtr.backends.base import Backend
from srtr.backends.provision import Provisioner
from srtr.reconciler.clock import Clock
from srtr.reconciler.workqueue import WorkQueue
from srtr.resources.objects import ExporterSpec, InstanceSpec
from srtr.resources.pins import Pins
from srtr.store.store import InstanceStatus, Store

if TYPE_CHECKING:
    from srtr.controllers.teardown_decisions import TierMemo

# A watched probe's transition, as its node reports it: (ok, failures in a row, message).
Report = Callable[[bool, int, str], None]


class Prober(Protocol):
    """Runs one attempt of an instance's readiness or liveness probe; never blocks the loop."""

    async def check(
        self, spec: InstanceSpec, status: InstanceStatus, run_dir: Path
    ) -> tuple[bool, str]: ...

    def forget(self, name: str) -> None:
        """Drop per-attempt probe state (log offsets) of an instance."""
        ...

    async def liveness(
        self, spec: InstanceSpec, status: InstanceStatus, run_dir: Path
    ) -> tuple[bool, str]:
        """One attempt of an instance's liveness probe, bounded by its `timeout_seconds`."""
        ...

    def watch(
        self,
        spec: InstanceSpec,
        status: InstanceStatus,
        run_dir: Path,
        *,
        kind: str,
        delay: float,
        report: Report,
    ) -> bool:
        """Have the instance's node run its `kind` probe (`liveness`, or `readiness` after
        the gate) every interval from `delay` seconds on, and `report` its transitions only.
        False where probes run on the controller's machine: the controller runs them."""
        ...

    async def scrape(self, exporter: ExporterSpec, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        """GET an exporter's URL once; healthy when it answers 200 within `timeout` seconds."""
        ...

    async def fleet(self, url: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        """Live members a cluster's head lists at `url`; None (and why) when it cannot say."""
        ...

    async def published(self, where: str, timeout: float) -> tuple[int | None, str]:  # noqa: ASYNC109
        """The count an autoscaled pool's instance 0 publishes at `where` (a URL or a path);
        None (and why) when there is none to read."""
        ...


class Launches:
    """The launches awaiting their backend's answer, each in a task of its own, up to the
    backend's `Capabilities.launches_in_flight` at once (`instance._launch`).

    While its launch is in flight an instance is still Pending (or BackOff) with its new
    attempt, and nothing may act on it as on one that never started: its own reconcile
    waits for the answer, the teardown does not end the job and a live edit does not forget
    it. The answer is applied, and their keys queued, as one step (`instance._await_launch`).
    """

    def __init__(self) -> None:
        self.names: set[str] = set()
        self._freed = asyncio.Event()

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return len(self.names)

    def begin(self, name: str) -> None:
        self.names.add(name)

    def end(self, name: str) -> None:
        self.names.discard(name)
        self._freed.set()

    async def slot(self, limit: int) -> None:
        """Return once fewer than `limit` launches are in flight."""
        while len(self.names) >= limit:
            self._freed.clear()
            await self._freed.wait()


def default_jitter() -> float:
    # ±20 %: restarts of many riders that died together spread out instead of landing at once.
    return random.uniform(0.8, 1.2)


@dataclass
class Ctx:
    store: Store
    backend: Backend
    clock: Clock
    queue: WorkQueue[str]
    prober: Prober
    run_dir: Path
    jitter: Callable[[], float] = default_jitter
    # Told (key, seconds, queue depth) after each reconcile: srtr's own metrics hook in here,
    # so controllers carry no metrics code and never import the runtime.
    on_reconciled: Callable[[str, float, int], None] | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    launches: Launches = field(default_factory=Launches)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The job's source pins: every re-planning of its recipe applies them (resources/pins.py).
    source_pins: Pins = field(default_factory=dict)
    # Where live edits get nodes beyond the allocation (the `grow` key); None: nowhere.
    provisioner: Provisioner | None = None
    # The teardown's last tier and its members (`teardown._step`): a teardown is looked at
    # after every batch of exits, and a pass over all of a big job's instances is ~70 ms.
    teardown_memo: TierMemo | None = None
    # Called once the job is over and the backend has asked its agents to end (`closing`).
    on_closing: list[Callable[[], None]] = field(default_factory=list)
    closing: bool = False
    # When `pace.wake_first` last queued each key at once (clock.now()).
    woken_at: dict[str, float] = field(default_factory=dict)

    @functools.cached_property
    def run_dir_path(self) -> str:
        """The run dir's absolute path (SRTR_RUN_DIR): worked out once, not per launch."""
        return str(self.run_dir.resolve())

    def when_closing(self, hook: Callable[[], None]) -> None:
        """Call `hook` once the backend has asked the agents to end, or now if it has: work
        that would block the loop at the job's end (a big job's last state.json) then
        overlaps the agents' goodbyes instead of delaying them."""
        if self.closing:
            hook()
        else:
            self.on_closing.append(hook)

    def began_closing(self) -> None:
        """The backend has asked its agents to end (`manager.run`): run the hooks."""
        self.closing = True
        hooks, self.on_closing = self.on_closing, []
        for hook in hooks:
            hook()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a side task (a probe attempt) without awaiting it in the reconcile."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def instance_key(name: str) -> str:
    return f"instance/{name}"


def probe_key(name: str) -> str:
    return f"probe/{name}"


def liveness_key(name: str) -> str:
    return f"liveness/{name}"


def gang_key(pool: str) -> str:
    """A pool that restarts as a whole (`restart.scope: pool`)."""
    return f"gang/{pool}"


def pool_key(name: str) -> str:
    return f"pool/{name}"


def fleet_key(stage: str) -> str:
    return f"fleet/{stage}"


def scale_key(pool: str) -> str:
    return f"scale/{pool}"


JOB = "job"
TEARDOWN = "teardown"
RECIPE = "recipe"
GROW = "grow"
