"""Memory cgroups of instances, and how the kernel's OOM killer is recognised.

An instance with `limits.memory` runs in a memory cgroup of its own, made by the process
group runner (`procgroup.ProcessGroups`) that starts it: on the local backend and on a node
agent (the SLURM step launcher leaves it to SLURM: `srun --mem`). The instance joins its
cgroup before its program starts: its command is wrapped in `sh -c 'echo $$ > PROCS &&
exec "$@"'`, so every process it forks is in the cgroup too, and its pid (and process
group) stay the instance's own.

Where cgroups live:

- cgroup v1 (a `memory` hierarchy, writable as root): under srtr's own memory cgroup, in
  `srtr-<pid>/<instance>.<attempt>`, with `memory.limit_in_bytes` (and the memory+swap
  limit, so that swap is no way around it). This machine's kind.
- cgroup v2 (the unified hierarchy): the same names under srtr's own cgroup, where the
  `memory` controller is delegated to it (listed in its `cgroup.subtree_control`), with
  `memory.max` and `memory.swap.max` 0.

Where neither works (no memory controller, not root, not delegated), `unavailable` says why:
the runtime warns once at the job's start (`limits_warning`) and the instances run without
their limit.

An OOM kill is recognised from what the kernel counts: the instance cgroup's `oom_kill`
(v1 `memory.oom_control`, v2 `memory.events`). An instance without a cgroup (no limit) can
still be OOM-killed, when the machine or a cgroup srtr itself runs in is out of memory:
when its leader dies of a SIGKILL srtr did not send, the kernel's log (`/dev/kmsg`, read
from where it stood when the runner started) is searched for the OOM killer's `Killed
process <pid>` of that leader. Where the log cannot be read (not root, or the kernel's pids
are not ours: another pid namespace), such a kill stays a plain SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal as signals
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from srtr.backends.base import LaunchSpec

log = logging.getLogger(__name__)

OOM_KILLED = "OOMKilled"
CGROUP_ROOT = Path("/sys/fs/cgroup")
_JOIN = 'echo $$ > "$0" && exec "$@"'


class Exit(Protocol):
    """What `procgroup.ExitStatus` is (kept apart: procgroup imports this module)."""

    @property
    def code(self) -> int: ...
    @property
    def signal(self) -> int | None: ...


@dataclass(frozen=True)
class Layout:
    """Where this process may make memory cgroups: `parent` (to be created), the cgroup
    `version`, and the names of the files that set the limit, the swap limit, and count OOM
    kills."""

    parent: Path
    version: int
    limit_file: str
    swap_file: str
    oom_file: str


def own_cgroup(proc_cgroup: str, *, v1: bool) -> str | None:
    """This process's cgroup path from /proc/self/cgroup's text: the `memory` controller's
    (v1), or the unified hierarchy's (`0::/path`, v2)."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if (v1 and "memory" in controllers.split(",")) or (not v1 and parts[0] == "0"):
            return path
    return None


def layout(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> Layout | str:
    """Where this process can make memory cgroups, or why it cannot (a sentence)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError as exc:
            return f"cannot read /proc/self/cgroup: {exc.strerror}"
    parent = f"srtr-{os.getpid()}"
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        own = own_cgroup(proc_cgroup, v1=True) or "/"
        if not os.access(v1 / own.lstrip("/"), os.W_OK):
            return f"cgroup v1: {v1 / own.lstrip('/')} is not writable (srtr is not root)"
        return Layout(
            v1 / own.lstrip("/") / parent,
            1,
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            "memory.oom_control",
        )
    if (root / "cgroup.controllers").exists():
        own = own_cgroup(proc_cgroup, v1=False) or "/"
        mine = root / own.lstrip("/")
        try:
            delegated = "memory" in (mine / "cgroup.subtree_control").read_text().split()
        except OSError:
            delegated = False
        if not delegated or not os.access(mine, os.W_OK):
            return f"cgroup v2: the memory controller is not delegated to srtr's cgroup {mine}"
        return Layout(mine / parent, 2, "memory.max", "memory.swap.max", "memory.events")
    return f"no memory cgroup controller under {root}"


def unavailable(root: Path = CGROUP_ROOT) -> str | None:
    """Why memory limits cannot be enforced on this machine, or None when they can."""
    found = layout(root)
    return found if isinstance(found, str) else None


def limits_warning(services: list[str], simulated_nodes: bool) -> str | None:
    """The job's start-up warning when `services` have a memory limit this machine cannot
    enforce. Only for simulated nodes, which are this machine: a node agent elsewhere warns
    in its own log, and SLURM's step launcher has `--mem`."""
    if not services or not simulated_nodes:
        return None
    why = unavailable()
    if why is None:
        return None
    return f"limits.memory of {', '.join(services)} is not enforced: {why}; they run without it"


def oom_kills(text: str) -> int:
    """The `oom_kill N` count of a memory.oom_control, memory.events or /proc/vmstat text."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class MemoryCgroups:
    """The memory cgroups of one `ProcessGroups`' attempts, and its OOM verdicts.

    `enabled` False (the SLURM backend, whose attempts are srun clients here): nothing is
    made and no exit is looked at.
    """

    def __init__(self, *, enabled: bool = True, root: Path = CGROUP_ROOT) -> None:
        self.enabled = enabled
        self._root = root
        self._layout: Layout | str | None = None
        self._groups: dict[str, Path] = {}  # instance name → its live attempt's cgroup
        self._stale: list[Path] = []  # cgroups of ended attempts not yet empty
        self._sigkilled: set[str] = set()  # sent SIGKILL by srtr: not the OOM killer's
        self._kernel_log = KernelLog() if enabled else None

    def argv(self, spec: LaunchSpec, argv: list[str]) -> list[str]:
        """`argv`, joining the attempt's new memory cgroup first when it has a limit.

        Without a cgroup (none possible here: warned once) it runs without the limit."""
        self._sigkilled.discard(spec.name)
        if not self.enabled or spec.memory_limit is None:
            return argv
        group = self._make(spec.name, spec.attempt, spec.memory_limit)
        if group is None:
            return argv
        self._groups[spec.name] = group
        return ["/bin/sh", "-c", _JOIN, str(group / "cgroup.procs"), *argv]

    def signalled(self, name: str, signum: int) -> None:
        if signum == signals.SIGKILL:
            self._sigkilled.add(name)

    def reason(self, name: str, status: Exit, pid: int = 0) -> str:
        """OOMKilled when the kernel's OOM killer ended the attempt of `name` (its leader
        `pid`), else ''; its cgroup goes (now, or once its last process is gone)."""
        if not self.enabled:
            return ""
        group = self._groups.pop(name, None)
        killed = name in self._sigkilled  # srtr's own SIGKILL: not the OOM killer's
        self._sigkilled.discard(name)
        oom = ""
        if group is not None and self._layout is not None and not isinstance(self._layout, str):
            if status.code != 0 and oom_kills(_read(group / self._layout.oom_file)) > 0:
                oom = OOM_KILLED
            self._remove(group)
        elif status.signal == signals.SIGKILL and not killed and self._kernel_log is not None:
            oom = OOM_KILLED if self._kernel_log.oom_killed(pid) else ""
        return oom

    def close(self) -> None:
        """Remove every cgroup made, and their parent (once their processes are gone)."""
        if self._kernel_log is not None:
            self._kernel_log.close()
        for group in [*self._groups.values(), *self._stale]:
            with contextlib.suppress(OSError):
                group.rmdir()
        self._groups.clear()
        self._stale.clear()
        if isinstance(self._layout, Layout):
            with contextlib.suppress(OSError):
                self._layout.parent.rmdir()

    def _make(self, name: str, attempt: int, limit: int) -> Path | None:
        where = self._where()
        if where is None:
            return None
        self._sweep()
        group = where.parent / f"{name}.{attempt}"
        try:
            where.parent.mkdir(exist_ok=True)
            group.mkdir(exist_ok=True)
            (group / where.limit_file).write_text(str(limit))
        except OSError as exc:
            log.warning("memory cgroup %s: %s; %s runs without its limit", group, exc, name)
            return None
        swap = 0 if where.version == 2 else limit
        with contextlib.suppress(OSError):  # no swap accounting: nothing to close
            (group / where.swap_file).write_text(str(swap))
        return group

    def _where(self) -> Layout | None:
        if self._layout is None:
            self._layout = layout(self._root)
            if isinstance(self._layout, str):
                log.warning("memory limits are not enforced: %s", self._layout)
        return self._layout if isinstance(self._layout, Layout) else None

    def _remove(self, group: Path) -> None:
        try:
            group.rmdir()
        except OSError:
            self._stale.append(group)  # its members die with their group's SIGKILL

    def _sweep(self) -> None:
        """Remove the cgroups of ended attempts whose last member has gone since."""
        left = []
        for group in self._stale:
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(group)
        self._stale = left


class KernelLog:
    """The kernel's log from now on (`/dev/kmsg`), searched for the OOM killer's victims.

    Opened at once, at its end: what the kernel logs later is read only when a leader died
    of a SIGKILL nobody here sent, and kept (a few records) for the next question."""

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self._victims: set[int] = set()
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            self._fd = None

    def oom_killed(self, pid: int) -> bool:
        """Whether the OOM killer logged `Killed process <pid>` since the log was opened."""
        self._read()
        if pid in self._victims:
            self._victims.discard(pid)
            return True
        return False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read(self) -> None:
        while self._fd is not None:
            try:
                record = os.read(self._fd, 8192)  # /dev/kmsg: one record per read
            except BlockingIOError:
                return  # nothing more
            except BrokenPipeError:
                continue  # records were overwritten before we read them: go on
            except OSError:
                self.close()
                return
            if not record:
                return
            self._victims.update(oom_victims(record.decode(errors="replace")))


# The OOM killer's line, in every kernel's wording (`Out of memory: Killed process 12 (x)`,
# `Memory cgroup out of memory: Killed process 12 (x)`, older kernels' bare line).
_VICTIM = re.compile(r"\bKilled process (\d+) \(")


def oom_victims(text: str) -> list[int]:
    """The pids the OOM killer's lines in `text` name (`... out of memory: Killed process
    8986 (python3) total-vm:...`)."""
    return [int(pid) for pid in _VICTIM.findall(text)]
