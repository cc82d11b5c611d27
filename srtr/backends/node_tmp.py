"""A simulated node's own temp dir on the local backend: "a node is a node" (issue #13 part 5).

Multi-node software assumes one host per node: Ray keeps its session, sockets and
`ray_current_cluster` under /tmp/ray, etcd and NATS put their data dirs under /tmp. Simulated
nodes share one machine, so each gets `<run dir>/nodes/<node>/tmp`:

- `TMPDIR` points at it (programs that honour TMPDIR, Ray among them, need nothing more);
- where the kernel allows a mount namespace (root, or an unprivileged user namespace),
  every process of the node also sees that dir *as* /tmp: the node has its own mount
  namespace (`unshare --mount --propagation private`) with that dir bind-mounted over /tmp,
  so programs that hard-code /tmp are separated too. TMPDIR is then /tmp itself, which
  keeps Unix socket paths short (Ray's must fit in 107 bytes).

What a node still shares: the network namespace (nodes keep their 127.0.0.K addresses, so
a wildcard bind still takes a port on every node), /dev/shm, the process table, and every
other path. The run dir stays visible at its own path inside the private /tmp (its top-level
directory under /tmp is bound back), as a cluster's shared filesystem would be, and so does
the controller's working directory.

Instances of one node share its dir and namespace view, so a Ray driver in the benchmark
step on node 1 finds the head's sockets under /tmp/ray like on a real node.

One namespace per node, made once (`enter`). Building the view at every launch (`wrap`:
unshare, sh, mkdir and a mount per shared entry, then the instance) made 4,096 local
instances take 16.2 s to be Running instead of 5.8 s, and a rider's relaunch 8.6 ms instead
of 2.7 ms (benchmarks/README.md). Now a short-lived *maker* (the same mounts under the same
`unshare`, then a shell that says "ready" and waits) builds a node's view; the controller
opens the maker's namespace files (/proc/PID/ns/mnt, and ns/user when not root) and kills
it. An open namespace file keeps the namespace and its mounts alive with no process in it,
so there is no holder process to watch, replace or leave behind: a namespace ends once the
controller's fds are closed (`close`, or its death, even by kill -9) and its last instance
is gone. Each launch is one exec of `nsenter --mount=/proc/<controller pid>/fd/N --wd=. --
argv` (not root: with `--user=... --preserve-credentials` first, so the instance is root in
the node's user namespace as under `unshare --map-root-user`). nsenter opens our fd by its
/proc path, so the instance inherits no extra fd; it execs, so the pid and process group
stay the instance's own; `--wd=.` keeps the cwd (entering a mount namespace resets it to /).
Measured, 256 nodes x 4 `sleep infinity`, `srtr up` to all Launched, one run each on a
shared 2-core machine: 6.0 s per-launch `wrap`, 2.6 s `enter`, 1.7 s TMPDIR only; a
SIGKILLed rider relaunched (median of 30) in 6.1 ms with `wrap`, 4.9 ms with `enter`.

Costs: one fd per node in the controller (two when not root). The first launch on a node
waits for its maker (about 5 ms of exec and mount work), so makers of the next nodes start
ahead (`_AHEAD`) and build their views on other cores while we launch. Where nsenter is
missing or fails its first use, or a maker fails, launches fall back to `wrap` (one
warning). Node agents (`--launcher agent`) keep using `wrap`: it runs once per node.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import select
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("srtr")

# Run inside the new mount namespace by `sh -c`: bind each shared /tmp entry back into the
# node dir, put the node dir over /tmp, then become the instance's own argv. $0 is a name,
# $1 the node dir, then the shared entries (relative to /tmp) up to "--", then the argv.
_SCRIPT = (
    'd=$1; shift; while [ "$1" != -- ]; do '
    'mkdir -p "$d/$1" && mount --bind "/tmp/$1" "$d/$1" || exit 111; shift; done; shift; '
    'mount --rbind "$d" /tmp || exit 111; exec "$@"'
)
_TMP = Path("/tmp")
# A maker, run by `sh -c` under the unshare prefix: `_SCRIPT`'s mounts (the node dir and its
# shared entries exist already), then say the view is ready and wait until the controller
# has opened the namespace files and kills it (or dies: read sees EOF). $0 is
# "srtr-ns-maker" and $1 the node dir, which name it in ps; then the shared entries.
_MAKE = (
    'd=$1; shift; for e; do mount --bind "/tmp/$e" "$d/$e" || exit 111; done; '
    'mount --rbind "$d" /tmp || exit 111; echo ready; read -r _'
)
_READY = b"ready\n"
_MAKER_TIMEOUT = 10.0
_AHEAD = 16  # makers running at once


def _unshare_prefix() -> tuple[list[str] | None, str]:
    """The `unshare` argv that gives a private mount namespace here, or None and why not."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None, "unshare(1) or mount(8) (util-linux) is not installed"
    base = ["unshare", "--mount", "--propagation", "private"]
    # Without root, a user namespace maps us to root inside it, which is what allows mounts.
    candidates = [base] if os.geteuid() == 0 else [["unshare", "--map-root-user", *base[1:]]]
    last = ""
    for prefix in candidates:
        try:
            done = subprocess.run(
                [*prefix, "mount", "--bind", "/tmp", "/tmp"],
                capture_output=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            last = str(exc)
            continue
        if done.returncode == 0:
            return prefix, ""
        last = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
    return None, f"the kernel refused a private mount namespace ({last})"


def _shared_entry(path: Path | None) -> str | None:
    """The top-level /tmp entry that holds `path`, relative to /tmp, or None."""
    if path is None:
        return None
    resolved = path.resolve()
    if resolved == _TMP or _TMP not in resolved.parents:
        return None
    return resolved.relative_to(_TMP).parts[0]


class NodeTmp:
    """Per-node temp dirs under `root` (`<run dir>/nodes`), with a private /tmp if possible."""

    def __init__(self, root: Path, nodes: Sequence[str] = ()) -> None:
        """`nodes`: the nodes in the order they are likely to be launched on, so their
        namespaces are made ahead of their first launch."""
        self.root = root
        self.prefix, self.why_not = _unshare_prefix()
        shared = {_shared_entry(root), _shared_entry(Path.cwd())}
        self.shared = sorted(s for s in shared if s is not None)
        root.mkdir(parents=True, exist_ok=True)
        # node → fds of its namespace files (user first when not root), or None: that node's
        # maker failed and it uses `wrap`.
        self._namespaces: dict[str, list[int] | None] = {}
        self._nsenter = shutil.which("nsenter") if self.prefix is not None else None
        self._checked = False  # nsenter has entered a namespace once
        self._makers: dict[str, subprocess.Popen[bytes] | str] = {}  # running, or why not
        self._upcoming = collections.deque(nodes)  # nodes whose maker has not started
        # node → (future set when its maker's answer can be read, the fd watched for it)
        self._answers: dict[str, tuple[asyncio.Future[None], int]] = {}
        self._warned = False
        mode = "private /tmp (mount namespace) and TMPDIR" if self.prefix else "TMPDIR only"
        note = f"node isolation: {mode}" + (f"; {self.why_not}" if self.why_not else "")
        (root / "isolation.txt").write_text(note + "\n")
        if self.why_not:
            log.warning("srtr: simulated nodes get TMPDIR only: %s", self.why_not)
        if self._nsenter is not None:
            self._start_makers(None)  # the first nodes' views get made while the job starts

    @property
    def private(self) -> bool:
        return self.prefix is not None

    def node_dir(self, node: str) -> Path:
        path = self.root / node / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def tmpdir(self, node: str) -> str:
        """TMPDIR of the node's processes: /tmp itself when it is private."""
        path = self.node_dir(node)
        return "/tmp" if self.private else str(path)

    def wrap(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run in the node's view of /tmp (unchanged when no namespace is possible).

        unshare and sh both exec, so the pid (and process group) stays the instance's own.
        """
        if self.prefix is None:
            return argv
        node_dir = str(self.node_dir(node))
        return [*self.prefix, "sh", "-c", _SCRIPT, "srtr-node", node_dir, *self.shared, "--", *argv]

    def enter(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run in the node's view of /tmp, entering the node's namespace (made at the
        node's first launch) with one exec; `wrap` where that is not possible."""
        if self._nsenter is None:
            return self.wrap(node, argv)
        if node not in self._namespaces:
            self._namespaces[node] = self._make(node)
        fds = self._namespaces[node]
        if fds is None or self._nsenter is None:
            return self.wrap(node, argv)
        return [*self._nsenter_argv(self._nsenter, fds), *argv]

    async def prepare(self, node: str) -> None:
        """Wait, without blocking the event loop, until `node`'s maker has made its view
        (no wait once made, or where `enter` will not use one).

        Launches on other nodes go on meanwhile: a pool of 32 on new nodes fans out as fast
        as with the per-launch `wrap` (waiting inside `enter` made its launches 0.1-0.2 s
        more spread out, measured by the `fanout` benchmark)."""
        if self._nsenter is None or node in self._namespaces:
            return
        answer = self._answers.get(node)
        if answer is None:
            self._start_makers(node)
            maker = self._makers.get(node)
            if not isinstance(maker, subprocess.Popen) or maker.stdout is None:
                return
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            fd = maker.stdout.fileno()
            loop.add_reader(fd, self._unwatch, node)
            answer = self._answers[node] = (future, fd)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(answer[0]), _MAKER_TIMEOUT)

    def _unwatch(self, node: str) -> None:
        """Stop watching `node`'s maker and wake its launches: it answered, or its pipe is
        about to be closed (the fd number is reused)."""
        answer = self._answers.pop(node, None)
        if answer is None:
            return
        future, fd = answer
        with contextlib.suppress(RuntimeError):  # no loop any more: nothing watches it
            asyncio.get_running_loop().remove_reader(fd)
        if not future.done():
            future.set_result(None)

    def close(self) -> None:
        """Let go of the nodes' namespaces (each ends with the last process in it) and end
        the makers not used yet. Only once every process started by an `enter` argv has
        entered (nsenter opens our fds by number): the local backend closes this after
        reaping its groups."""
        for fds in self._namespaces.values():
            for fd in fds or []:
                os.close(fd)
        self._namespaces.clear()
        for node in list(self._answers):
            self._unwatch(node)
        for maker in self._makers.values():
            if not isinstance(maker, str):
                _stop(maker)
        self._makers.clear()
        self._upcoming.clear()

    def _nsenter_argv(self, nsenter: str, fds: list[int]) -> list[str]:
        me = os.getpid()
        *user, mnt = (f"/proc/{me}/fd/{fd}" for fd in fds)
        enter_user = [f"--user={user[0]}", "--preserve-credentials"] if user else []
        return [nsenter, *enter_user, f"--mount={mnt}", "--wd=.", "--"]

    def _make(self, node: str) -> list[int] | None:
        """The fds of a new namespace for `node`, or None (and one warning) if that failed."""
        kinds = ["mnt"] if os.geteuid() == 0 else ["user", "mnt"]
        self._unwatch(node)
        self._start_makers(node)
        maker = self._makers.pop(node)
        made = maker if isinstance(maker, str) else _collect(maker, kinds)
        if isinstance(made, str):
            self._give_up(f"cannot make the mount namespace of {node}: {made}")
            return None
        if not self._checked and self._nsenter is not None:
            self._checked = True
            failed = _check_nsenter([*self._nsenter_argv(self._nsenter, made), "true"])
            if failed:
                for fd in made:
                    os.close(fd)
                self._nsenter = None
                self._give_up(f"nsenter cannot enter a node's namespace: {failed}")
                return None
        return made

    def _start_makers(self, node: str | None) -> None:
        """Start `node`'s maker and those of the next few nodes, which then build their views
        on other cores while we launch (256 nodes: 1.7 s one after the other)."""
        if node is not None and node not in self._makers:
            self._makers[node] = self._maker(node)
        while self._upcoming and len(self._makers) < _AHEAD:
            upcoming = self._upcoming.popleft()
            if upcoming not in self._makers and upcoming not in self._namespaces:
                self._makers[upcoming] = self._maker(upcoming)

    def _maker(self, node: str) -> subprocess.Popen[bytes] | str:
        assert self.prefix is not None
        try:
            node_dir = self.node_dir(node)
            for entry in self.shared:  # here rather than a mkdir(1) exec in the maker
                (node_dir / entry).mkdir(exist_ok=True)
        except OSError as exc:
            return str(exc)
        script = ["sh", "-c", _MAKE, "srtr-ns-maker", str(node_dir), *self.shared]
        return _start_maker([*self.prefix, *script])

    def _give_up(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("srtr: %s; such launches set up their node's private /tmp each time", why)


def _start_maker(argv: list[str]) -> subprocess.Popen[bytes] | str:
    """Start a maker (it builds the view, says ready, waits), or say why it did not start."""
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        return str(exc)


def _collect(maker: subprocess.Popen[bytes], kinds: list[str]) -> list[int] | str:
    """Open the maker's namespace files once it is ready, then let it go.

    Returns the fds (in `kinds` order), or why that failed."""
    assert maker.stdout is not None
    try:
        # poll, not select: a controller of thousands of instances has fds above 1023.
        poller = select.poll()
        poller.register(maker.stdout, select.POLLIN)
        ready = poller.poll(_MAKER_TIMEOUT * 1000)
        if not ready or maker.stdout.readline() != _READY:
            maker.kill()
            _, err = maker.communicate()
            return err.decode(errors="replace").strip() or f"no answer, exit {maker.returncode}"
        fds: list[int] = []
        try:
            for kind in kinds:
                fds.append(os.open(f"/proc/{maker.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            return str(exc)
        return fds
    finally:
        _stop(maker)


def _stop(maker: subprocess.Popen[bytes]) -> None:
    if maker.returncode is None:
        maker.kill()  # it only waits; a namespace we opened lives on in our fds
        maker.communicate()


def _check_nsenter(argv: list[str]) -> str:
    """Why `argv` (nsenter ... true) failed, or "" when it worked."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_MAKER_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    return done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
