"""A simulated node's own /tmp on the local backend, with every host path still visible.

Multi-node software assumes one host per node: Ray keeps its session, sockets and
`ray_current_cluster` under /tmp/ray, etcd and NATS put their data dirs under /tmp. Simulated
nodes share one machine, so each gets a *node view* (`node_view.make_view`): its own mount
namespace in which /tmp is an overlay of the host's /tmp with the node's writes on top. A
node reads every file of the machine as the host does (a venv, a program or a working
directory under /tmp included), and what it writes under /tmp is its own. The run
dir and the controller's working directory, when under /tmp, are the host's own dirs again
on every node (writes there are shared, as on a cluster's shared filesystem). TMPDIR is /tmp,
which keeps Unix socket paths short (Ray's must fit in 107 bytes).

Where that is impossible (no user namespaces without root, no overlayfs, no nsenter), each
node gets `TMPDIR=<run dir>/nodes/<node>/tmp` instead, with one warning: programs that honour
TMPDIR (Ray does) are separated, programs that hard-code /tmp are not. `SRTR_NODE_ISOLATION=
tmpdir` asks for that mode (the benchmarks compare the two in one run).

Cost, and why it is built this way. The views are made once per node, off the launch path:
one short-lived helper process (`python -I .../srtr/backends/node_view.py`, started with the job)
makes every node's view in turn and passes each namespace back as an fd over a Unix socket;
1,024 views take it 0.5-0.8 s on another core while the job starts. An open namespace fd keeps
the namespace and its mounts alive with no process in it, so there is no holder process to
watch or leave behind: a namespace ends once the controller's fds are closed (`close`, or
its death, even by kill -9) and its last process is gone. As root, the launching thread
enters the node's view itself around the Popen (`entered`: setns(2) there and back, 17 µs);
otherwise (and for node agents) each launch is one exec of
`nsenter --mount=/proc/<controller pid>/fd/N --wd=. -- argv` (not root: `--user=...
--preserve-credentials` first, so the instance is root in the job's user namespace as under
`unshare --map-root-user`). nsenter opens our fd by its /proc path, so the instance inherits
no extra fd; it execs, so the pid and process group stay the instance's own; `--wd=.` keeps
the cwd (entering a mount namespace resets it to /). The previous design, a maker process of
`unshare`, `sh` and `mount` execs per node, cost 4,096 instances 11.6-18.3 s to be Running
(5.8 s without namespaces); benchmarks/README.md has the figures of this one.

Node agents (`--launcher agent`) enter their node's view the same way, once per node; the
instances they start inherit it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from srtr.backends.local import node_view
from srtr.backends.local.node_view import TMP, UPPER, shared_paths

log = logging.getLogger("srtr")

MODE_ENV = "SRTR_NODE_ISOLATION"  # "tmpdir": no node views, TMPDIR only
_TIMEOUT = 10.0  # for one node's view to arrive
_CLONE_FS = 0x00000200
_NOTE = "node isolation: {}"
VIEW = "own /tmp over the host's (overlay in a mount namespace), TMPDIR=/tmp"
TMPDIR_ONLY = "TMPDIR only"


class NodeTmp:
    """The simulated nodes' views under `root` (`<run dir>/nodes`), or their TMPDIRs."""

    def __init__(self, root: Path, nodes: Sequence[str], *, shared: Sequence[Path] = ()) -> None:
        """Start making the views of `nodes` (in the order they are likely to be launched
        on). `shared`: paths to keep the host's own on every node besides the run dir
        (`root`'s parent) and the working directory."""
        root.mkdir(parents=True, exist_ok=True)
        self.root = root = root.resolve()  # the helper runs in /
        self._shared = shared_paths([root.parent, Path.cwd(), *shared], TMP)
        self._nsenter = shutil.which("nsenter")
        self._views: dict[str, int | None] = {}  # node → its mount namespace fd, or None
        self._user: int | None = None  # the job's user namespace (not root)
        self._checked = False  # nsenter has entered a view once
        self._warned = False
        self._sock: socket.socket | None = None
        self._helper: subprocess.Popen[bytes] | None = None
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._reading: asyncio.AbstractEventLoop | None = None
        self._asked = set(nodes)
        self._adopted: set[str] = set()  # nodes whose view is an adopted instance's
        self._users: dict[str, int] = {}  # their user namespaces (not root)
        # Whether launching threads enter views themselves (`entered`): None until tried.
        self._here: bool | None = None
        self._home: int | None = None  # our own mount namespace, to come back to
        self._own: set[int] = set()  # threads with a cwd and root of their own
        self._made: set[str] = set()  # nodes whose node dir exists
        self._cwd = os.getcwd()
        why = self._start(list(nodes))
        mode = VIEW if not why else f"{TMPDIR_ONLY}; {why}"
        (root / "isolation.txt").write_text(_NOTE.format(mode) + "\n")
        if why and os.environ.get(MODE_ENV) != "tmpdir":
            self._warn(why)

    def node_dir(self, node: str) -> Path:
        """What `node` wrote under /tmp (in its view; or its TMPDIR)."""
        path = self.root / node / UPPER
        if node not in self._made:  # once: this is on the launch path of every instance
            path.mkdir(parents=True, exist_ok=True)
            self._made.add(node)
        return path

    def tmpdir(self, node: str) -> str:
        """TMPDIR of the node's processes: /tmp itself when the node has a view."""
        if self._views.get(node) is not None and (self._nsenter or self._here is True):
            return "/tmp"
        return str(self.node_dir(node))

    def enter(self, node: str, argv: list[str], *, here: bool = False) -> list[str]:
        """`argv` run in `node`'s view (waiting for the view if it was not made yet: call
        `prepare` first not to block), or unchanged where the node has no view.

        `here`: the caller starts `argv` inside `entered(node)`; then, as root, `argv` comes
        back unchanged and the view is entered by the starting thread itself."""
        fd = self._view(node)
        if fd is None:
            return argv
        if here and node not in self._users and self._can_enter_here(fd):
            return argv
        if self._nsenter is None:
            return argv
        return [*self._nsenter_argv(self._nsenter, fd, self._users.get(node)), *argv]

    @contextlib.contextmanager
    def entered(self, node: str) -> Iterator[None]:
        """The calling thread in `node`'s view for the block, so that a process it starts
        there is in the view from its first instruction (as root; `enter(..., here=True)`
        inside the block then leaves the argv as it is; otherwise nothing happens). The
        block must not await: the event loop's thread leaves the host's mount namespace for
        its duration (microseconds: the setns(2) calls and a vfork). The cwd is kept, as
        `nsenter --wd=.` keeps it.

        This is the launch path of the local backend: no exec of nsenter per launch (1.3 ms
        of a child's time each, measured: 0.7 ms for `true` alone, 2.0 ms through nsenter)."""
        fd = self._view(node)
        if fd is None or node in self._users or not self._can_enter_here(fd):
            yield
            return
        assert self._home is not None
        self._own_fs()
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                node_view.setns(fd, node_view.CLONE_NEWNS)
            except OSError as exc:  # from now on `enter` puts nsenter in front instead
                self._here = False
                log.warning("srtr: cannot enter %s's view in-process: %s", node, exc)
                yield
                return
            try:
                os.fchdir(cwd)
                yield
            finally:
                node_view.setns(self._home, node_view.CLONE_NEWNS)
                os.fchdir(cwd)
        finally:
            os.close(cwd)

    def _can_enter_here(self, fd: int) -> bool:
        """Whether this thread can enter views itself (root: no user namespace to enter,
        which a process with threads cannot), tried once on a real view."""
        if self._here is None:
            self._here = False
            if os.geteuid() == 0 and self._user is None:
                try:
                    self._own_fs()
                    self._home = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                    node_view.setns(fd, node_view.CLONE_NEWNS)
                    node_view.setns(self._home, node_view.CLONE_NEWNS)
                    os.chdir(self._cwd)
                    self._here = True
                except OSError as exc:
                    log.info("srtr: node views entered with nsenter: %s", exc)
        return self._here

    def _own_fs(self) -> None:
        """Give the calling thread its own cwd and root (unshare CLONE_FS): setns(2) into a
        mount namespace refuses a thread that shares them with others (the loop's thread
        shares them with asyncio's executor threads)."""
        ident = threading.get_native_id()
        if ident not in self._own:
            node_view.unshare(_CLONE_FS)
            self._own.add(ident)

    async def prepare(self, node: str) -> None:
        """Wait, without blocking the event loop, until `node`'s view has arrived (no wait
        once it has, or when there will be none). Launches on other nodes go on meanwhile."""
        if node in self._views or self._sock is None:
            return
        loop = asyncio.get_running_loop()
        if self._reading is None:
            self._reading = loop
            loop.add_reader(self._sock.fileno(), self._receive, False)
        waiter = self._waiters.get(node)
        if waiter is None:
            waiter = self._waiters[node] = loop.create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), _TIMEOUT)

    def close(self) -> None:
        """Let go of the nodes' views (each ends with its last process) and stop the helper.
        Only once every process started by an `enter` argv has entered (nsenter opens our
        fds by number): the local backend closes this after reaping its groups."""
        self._stop_reading()
        for fd in self._views.values():
            if fd is not None:
                os.close(fd)
        self._views.clear()
        for fd in self._users.values():
            os.close(fd)
        self._users.clear()
        if self._home is not None:
            os.close(self._home)
            self._home = None
        self._here = None
        if self._user is not None:
            os.close(self._user)
            self._user = None
        self._end_helper()

    def adopt(self, node: str, pid: int) -> None:
        """`node`'s view is the one of `pid`, an instance an earlier controller started there
        (`srtr up --adopt`): the node's next launches join its namespace and see its /tmp."""
        if node in self._adopted:
            return
        kinds = ["mnt"] if self._user is None and os.geteuid() == 0 else ["mnt", "user"]
        try:
            fds = [os.open(f"/proc/{pid}/ns/{k}", os.O_RDONLY | os.O_CLOEXEC) for k in kinds]
        except OSError:
            return  # gone already: the node keeps the view made for it
        old = self._views.get(node)
        if old is not None:
            os.close(old)
        self._views[node] = fds[0]
        if len(fds) > 1:
            self._users[node] = fds[1]
        self._adopted.add(node)
        self._wake(node)

    # -- making the views

    def _start(self, nodes: list[str]) -> str:
        """Start the helper that makes the views, or say why the nodes get TMPDIR only."""
        if os.environ.get(MODE_ENV) == "tmpdir":
            return f"{MODE_ENV}=tmpdir"
        if self._nsenter is None:
            return "nsenter(1) (util-linux) is not installed"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"shared": self._shared, "nodes": [[n, str(self.root / n)] for n in nodes]}
        try:
            with open(self.root / "views.log", "ab") as errors:
                self._helper = subprocess.Popen(
                    # The module's own file, isolated (-I): it needs only the standard
                    # library, so it runs however srtr was installed or put on sys.path.
                    [sys.executable, "-I", node_view.__file__, str(theirs.fileno())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    pass_fds=[theirs.fileno()],
                    cwd="/",
                )
            assert self._helper.stdin is not None
            self._helper.stdin.write(json.dumps(request).encode())
            self._helper.stdin.close()
        except OSError as exc:
            ours.close()
            self._end_helper()
            return f"cannot start the helper that makes the node views: {exc}"
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        return ""

    def _view(self, node: str) -> int | None:
        """`node`'s namespace fd (waiting for it if needed), or None: TMPDIR only."""
        deadline = time.monotonic() + _TIMEOUT
        while node not in self._views and self._sock is not None:
            if not self._receive(True, deadline - time.monotonic()):
                self._views[node] = None
                self._warn(f"the view of {node} was not made within {_TIMEOUT:g}s")
        fd = self._views.get(node)
        if fd is not None and not self._checked and self._nsenter is not None:
            self._checked = True
            failed = _check([*self._nsenter_argv(self._nsenter, fd, self._users.get(node)), "true"])
            if failed:
                self._nsenter = None
                why = f"nsenter cannot enter a node's view: {failed}"
                self._warn(why)
                self._rewrite_note(why)
                return None
        return fd if self._nsenter is not None else None

    def _receive(self, block: bool, within: float = 0.0) -> bool:
        """Read the helper's answers that are there (`block`: wait up to `within` s for
        one). False when nothing came in time."""
        assert self._sock is not None
        if block:
            poller = select.poll()  # poll, not select: our fds may be above 1023
            poller.register(self._sock, select.POLLIN)
            if not poller.poll(max(within, 0) * 1000):
                return False
        while self._sock is not None:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, 4096, 2, socket.MSG_CMSG_CLOEXEC)
                for fd in fds:  # Python 3.11's recv_fds drops the flag: a launch must not leak
                    os.set_inheritable(fd, False)
            except BlockingIOError:
                break
            except OSError as exc:
                self._done(f"cannot read the node views: {exc}")
                break
            if not data:  # the helper exited: every node it did not answer has no view
                left = self._asked - self._views.keys()
                early = f"the node views' helper exited early (see {self.root / 'views.log'})"
                self._done(early if left else "")
                break
            self._answer(data.decode(errors="replace"), fds)
        return True

    def _answer(self, message: str, fds: list[int]) -> None:
        kind, _, rest = message.partition(" ")
        node, _, why = rest.partition(" ")
        if kind == "user" and fds:
            self._user = fds[0]
        elif kind == "ok" and fds and node in self._adopted:
            os.close(fds[0])
        elif kind == "ok" and fds:
            self._views[node] = fds[0]
            self._wake(node)
        elif kind == "err" and node not in self._adopted:
            self._views[node] = None
            self._warn(f"cannot make the view of {node}: {why}")
            self._wake(node)
        elif kind == "fatal":
            self._done(rest)
        for extra in fds[1:]:
            os.close(extra)

    def _done(self, why: str) -> None:
        """No more views will come: the nodes without one get TMPDIR (one warning)."""
        if why and not any(fd is not None for fd in self._views.values()):
            self._warn(why)
            self._rewrite_note(why)
        self._stop_reading()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for node in list(self._waiters):
            self._wake(node)
        self._end_helper()

    def _rewrite_note(self, why: str) -> None:
        with contextlib.suppress(OSError):
            (self.root / "isolation.txt").write_text(_NOTE.format(f"{TMPDIR_ONLY}; {why}") + "\n")

    def _wake(self, node: str) -> None:
        waiter = self._waiters.pop(node, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _stop_reading(self) -> None:
        if self._reading is not None and self._sock is not None:
            with contextlib.suppress(RuntimeError, ValueError):  # the loop may be closed
                self._reading.remove_reader(self._sock.fileno())
        self._reading = None

    def _end_helper(self) -> None:
        helper, self._helper = self._helper, None
        if helper is not None:
            if helper.poll() is None:
                helper.kill()
            helper.wait()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _nsenter_argv(self, nsenter: str, fd: int, user_fd: int | None = None) -> list[str]:
        me = os.getpid()
        user_fd = self._user if user_fd is None else user_fd
        user = [] if user_fd is None else [f"--user=/proc/{me}/fd/{user_fd}"]
        keep = ["--preserve-credentials"] if user else []
        return [nsenter, *user, *keep, f"--mount=/proc/{me}/fd/{fd}", "--wd=.", "--"]

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("srtr: simulated nodes get TMPDIR only: %s", why)


def _check(argv: list[str]) -> str:
    """Why `argv` (nsenter ... true) failed, or "" when it worked."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    return done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
