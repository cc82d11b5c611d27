"""Watch a running job's recipe file; each save's text goes to the store (live edits).

The watcher only reads: each save's text (or why it cannot be read) is recorded in the store
(`Store.recipe_saved`) and the `recipe` key queued; the recipe controller
(`controllers/recipe.py`) plans it, and applies it at once (`--apply auto`) or holds it for
the user's yes (`--apply confirm`).

inotify does not see edits made on another host of a network filesystem, so on NFS, Lustre,
GPFS and friends (or with `--watch-poll`) the watcher polls the file instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import watchfiles

from srtr.controllers.context import RECIPE, Ctx
from srtr.resources.errors import RecipeError
from srtr.resources.loading import read_text

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
    """Records saves of `path` in the store of the job in `ctx`."""

    def __init__(self, ctx: Ctx, path: Path, *, poll: bool | None = None) -> None:
        self.ctx = ctx
        self.path = path
        self.poll = needs_polling(path) if poll is None else poll
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
                    self.check()
        except Exception:  # a broken watch must not take the job down
            log.exception("watching %s failed; live edits are off", self.path)

    def check(self) -> None:
        """Read the file once; its text (or why it cannot be read) goes to the store."""
        try:
            text = read_text(self.path)
        except RecipeError as exc:
            self.ctx.store.recipe_unreadable(exc.lines())
        else:
            self.ctx.store.recipe_saved(text)
        self.ctx.queue.add(RECIPE)
