"""Watch a running job's recipe file and turn each save into a plan (live edits).

Each change is loaded and validated like `srtr plan`; an invalid recipe becomes a
`RecipeRejected` event and touches nothing. A valid one is expanded against the running
job's node map (running instances never move), diffed, and then applied at once
(`--apply auto`) or held for the user's yes (`--apply confirm`).

inotify does not see edits made on another host of a network filesystem, so on NFS, Lustre,
GPFS and friends (or with `--watch-poll`) the watcher polls the file instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import watchfiles

from srtr.backends import git_refs
from srtr.controllers import edits
from srtr.controllers.context import Ctx
from srtr.reconciler.persist import write_atomic
from srtr.resources.diff import diff
from srtr.resources.errors import GrowRequired, RecipeError
from srtr.resources.loading import read_text
from srtr.resources.objects import DesiredState
from srtr.resources.pins import PINS_FILE, pins_json, unpinned
from srtr.resources.planning import plan_text_source
from srtr.runtime.grow import Allocation, Grower

log = logging.getLogger("srtr")

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "smbfs",
        "beegfs",
        "ceph",
        "fuse.sshfs",
        "fuse.glusterfs",
        "glusterfs",
        "panfs",
        "wekafs",
        "9p",
    }
)
POLL_MS = 300


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path`, from /proc/mounts ("" when unknown)."""
    target = str(path.resolve())
    best, kind = "", ""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best):
                    best, kind = point, parts[2]
    except OSError:
        return ""
    return kind


def needs_polling(path: Path) -> bool:
    return filesystem_type(path) in NETWORK_FILESYSTEMS


class RecipeWatcher:
    """Turns saves of `path` into plans for the job in `ctx`."""

    def __init__(
        self,
        ctx: Ctx,
        path: Path,
        allocation: Sequence[tuple[str, str]] | Allocation,
        *,
        auto: bool,
        poll: bool | None = None,
    ) -> None:
        self.ctx = ctx
        self.path = path
        self.allocation = (
            allocation if isinstance(allocation, Allocation) else Allocation(allocation)
        )
        # Set by the job when its backend can bring more nodes (`grow.Grower`); without
        # one, an edit that needs more nodes than are spare is refused.
        self.grower: Grower | None = None
        self.no_grow = ""  # why nothing grows here (`JobOptions.no_grow`), for refusals
        # Autoscaled pools' sizes now (`runtime.autoscale`): every planning of the file uses
        # them, so a saved edit keeps what the autoscaler decided (within its new bounds).
        self.sizes: dict[str, int] = {}
        self.auto = auto
        self.poll = needs_polling(path) if poll is None else poll
        self._last_seen = ctx.store.recipe_text
        self._target = os.path.realpath(path)

    def _touches_recipe(self, changes: set[tuple[watchfiles.Change, str]]) -> bool:
        return any(os.path.realpath(p) == self._target for _, p in changes)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until `stop` is set. Errors of the watch itself are logged, never raised."""
        try:
            # Watch the directory: editors that save by rename replace the file's inode.
            async for changes in watchfiles.awatch(
                self.path.parent,
                stop_event=stop,
                force_polling=self.poll,
                poll_delay_ms=POLL_MS,
                debounce=50,
                # watchfiles' Rust loop takes the GIL once per step: at 20 ms that was 0.4 %
                # of a core for an idle job (benchmarks/hollow.py); 100 ms costs a save at
                # most ~0.1 s more before it is planned.
                step=100,
                recursive=False,
            ):
                if self._touches_recipe(changes):
                    await self.check()
        except Exception:  # a broken watch must not take the job down
            log.exception("watching %s failed; live edits are off", self.path)

    async def check(self, *, force: bool = False) -> None:
        """Read the file once and act on it if it changed since last time (`force`: even if
        not: the nodes a grow request asked for joined)."""
        try:
            text = read_text(self.path)
        except RecipeError as exc:
            self._reject(exc.lines())
            return
        if text == self._last_seen and not force:
            return
        self._last_seen = text
        store = self.ctx.store
        try:
            new = await self._plan(text)
        except GrowRequired as exc:
            if self.grower is None:
                self._reject([*exc.lines(), *([self.no_grow] if self.no_grow else [])])
            else:
                await self.grower.want(exc)
            return
        except RecipeError as exc:
            self._reject(exc.lines())
            return
        if self.grower is not None:
            await self.grower.settled()
        for warning in new.line_warnings:  # placeholder typos: warned, never refused
            store.record("job", "PlanWarning", warning, warning=True)
        launched = frozenset(n for n, st in store.status.items() if st.attempt >= 0)
        plan = diff(store.desired, new, launched=launched)
        edits.propose(self.ctx, new, plan, text, auto=self.auto)

    async def _plan(self, text: str) -> DesiredState:
        """Plan `text` with the job's pins; the source of a service the edit adds is pinned
        first (off the loop: `git ls-remote` may take its time) and joins the job's pins.

        Raises:
            RecipeError: the recipe is invalid, or a new source's rev does not resolve.
        """
        file, nodes, ctx = str(self.path), self.ctx.store.desired.nodes, self.ctx
        allocation, provisioned = self.allocation.nodes, self.allocation.provisioned
        sizes = self.sizes
        recipe, new = plan_text_source(
            text,
            file,
            allocation,
            nodes,
            pins=ctx.source_pins,
            provisioned=provisioned,
            sizes=sizes,
        )
        # Only services new to the job: another rev of one it runs keeps the job's pin out of
        # its plan (its clone step differs, and the edit is refused while it runs).
        running = {spec.service for spec in ctx.store.desired.instances}
        missing = [(i, s) for i, s in unpinned(recipe, ctx.source_pins) if s.name not in running]
        if not missing:
            return new
        found = await asyncio.to_thread(git_refs.pin_services, missing, text, file)
        ctx.source_pins = {**ctx.source_pins, **found}
        try:
            await asyncio.to_thread(
                write_atomic, ctx.run_dir / PINS_FILE, pins_json(ctx.source_pins)
            )
        except OSError as exc:  # kept in memory; an adoption would plan it unpinned
            log.warning("cannot record the new source pins in %s: %s", PINS_FILE, exc)
        return plan_text_source(
            text,
            file,
            allocation,
            nodes,
            pins=ctx.source_pins,
            provisioned=provisioned,
            sizes=sizes,
        )[1]

    def _reject(self, lines: list[str]) -> None:
        edits.reject(self.ctx, lines)
