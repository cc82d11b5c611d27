"""A simulated node's view of the machine: every path as on the host, /tmp its own.

`make_view` is the whole mount logic, for any code that simulates nodes on one machine (the
local backend here; a test cluster whose nodes are namespaces could call it too). In a new
mount namespace of the calling thread it mounts an overlay on /tmp:

- the lower layer is the host's /tmp itself, so every file under /tmp (a venv, a checkout,
  a program, data) reads as on the host, and so does every path outside /tmp (untouched);
- the upper layer is the node's own dir: what the node writes, creates or deletes under
  /tmp lands there, and neither the host nor another node sees it;
- `shared` paths under /tmp (the run dir, the working directory) are bound back on top,
  the host's own dirs, so writes there reach the host as on a cluster's shared filesystem;
  so are the mounts under /tmp (`submounts`), which an overlay's lower layer does not show.

Where the upper layer lives. An overlay's upper and work dirs must not lie inside its lower
layer (the kernel documents such layers as overlapping, with undefined behaviour). So when
the node dir is outside /tmp (a run dir under the working directory, the usual case) the
upper dir is `<node dir>/tmp` on disk: the node's /tmp writes stay in the run dir after the
job, as Ray's logs under /tmp/ray should. When the node dir is itself under /tmp, a tmpfs is
mounted on the node dir first (in the node's namespace only) and holds upper and work: the
node still sees its writes at `<node dir>/tmp`, the host does not, and they end with the
namespace. Measured (2 cores, root): making one view costs 0.8-1.7 ms either way.

`main` is a short-lived helper process (`python -I <this file> FD`) that makes the
views of many nodes one after the other in its single thread and hands each namespace to its
parent as a file descriptor over a Unix socket (SCM_RIGHTS), then exits: no process per node,
no exec per node. Without root it first enters one new user namespace (mapped to root in it,
as `unshare --map-root-user`), which allows the mounts; every node's namespace belongs to it.
It is single-threaded on purpose: a process with threads cannot enter a new user namespace.

Only the kernel's mount(2)/unshare(2)/setns(2) through ctypes (Python 3.11 has no
os.unshare); nothing from srtr is imported, so the helper starts in ~30 ms.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_NOSUID = 2
_MS_NODEV = 4
TMP = Path("/tmp")
UPPER = "tmp"  # <node dir>/tmp: what the node wrote under /tmp
WORK = ".overlay-work"  # overlayfs's scratch dir, on the upper dir's filesystem

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str) -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or 'bind'} on {target}",
    )


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, flags: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(flags)), "setns")


def in_memory(node_dir: Path, tmp: Path = TMP) -> bool:
    """Whether `node_dir` lies under `tmp`, so its upper layer must be a tmpfs."""
    resolved = node_dir.resolve()
    return resolved == tmp or tmp.resolve() in resolved.parents


def shared_paths(paths: Sequence[Path], tmp: Path = TMP) -> list[str]:
    """The paths among `paths` to bind back over a node's /tmp: those strictly under `tmp`,
    without one that another of them already holds (outermost first)."""
    under = sorted({str(p.resolve()) for p in paths if in_memory(p, tmp) and p.resolve() != tmp})
    kept: list[str] = []
    for path in under:
        if not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def submounts(tmp: Path = TMP) -> list[Path]:
    """Mount points strictly under `tmp` in our mount namespace. An overlay's lower layer
    shows none of them (only the directories beneath), so they are bound back as they are."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split(" ")
            if len(fields) > 4:
                # mountinfo escapes space, tab, newline and backslash as octal (\040).
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                if Path(point).is_relative_to(tmp) and Path(point) != tmp:
                    found.append(Path(point))
    return found


def _escape(path: str) -> str:
    # overlayfs splits its legacy options at ',' and lowerdir at ':'; '\' escapes them.
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def make_view(node_dir: Path, shared: Sequence[str], *, memory: bool, tmp: Path = TMP) -> None:
    """Move the calling thread into a new mount namespace in which /tmp is the host's /tmp
    with `node_dir`'s writes on top, and each of `shared` (absolute paths under `tmp`, see
    `shared_paths`) the host's own dir again. `memory`: upper and work dirs on a tmpfs
    mounted on `node_dir` (required when `node_dir` is under `tmp`, see `in_memory`).

    Needs CAP_SYS_ADMIN in the caller's user namespace. On error the thread is left in the
    new namespace, partly mounted: the caller returns to its own with `setns`.

    Raises:
        OSError: a mount or the unshare failed.
    """
    unshare(CLONE_NEWNS)
    # Nothing mounted here may propagate back to the host (or to another node).
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, "")
    # The host's shared dirs, held before the overlay hides them behind their merged views.
    held = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in shared]
    try:
        if memory:
            _mount("srtr-node", str(node_dir), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
        upper, work = node_dir / UPPER, node_dir / WORK
        upper.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        options = f"lowerdir={_escape(str(tmp))},upperdir={_escape(str(upper))}"
        _mount("srtr-node", str(tmp), "overlay", 0, f"{options},workdir={_escape(str(work))}")
        for path, fd in zip(shared, held, strict=True):
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, "")
    finally:
        for fd in held:
            os.close(fd)


def enter_user_namespace() -> None:
    """Become root of a new user namespace mapped to our own uid and gid (unprivileged)."""
    uid, gid = os.geteuid(), os.getegid()
    unshare(CLONE_NEWUSER | CLONE_NEWNS)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def _send(sock: socket.socket, message: str, fds: list[int]) -> None:
    while True:
        try:
            socket.send_fds(sock, [message.encode()], fds)
            return
        except OSError as exc:
            # Too many fds in flight for our open-file limit: the parent drains them.
            if exc.errno != errno.ETOOMANYREFS:
                raise
            time.sleep(0.001)


def serve(sock: socket.socket, request: dict[str, object]) -> int:
    """Make each requested node's view and send its namespace fd(s) on `sock`.

    `request`: {"shared": [...], "nodes": [[name, node dir], ...]}. Messages: "user" with
    the user namespace's fd (unprivileged only, first), then "ok <node>" with the node's
    mount namespace fd or "err <node> <why>", in the order asked; "fatal <why>" ends it."""
    asked = [Path(p) for p in request["shared"]]  # type: ignore[attr-defined]
    shared = shared_paths([*asked, *submounts()])
    nodes: list[list[str]] = request["nodes"]  # type: ignore[assignment]
    try:
        if os.geteuid() != 0:
            enter_user_namespace()
            user = os.open("/proc/self/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            _send(sock, "user", [user])
            os.close(user)
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        _send(sock, f"fatal cannot enter a user namespace: {exc}", [])
        return 1
    for name, where in nodes:
        node_dir = Path(where)
        try:
            node_dir.mkdir(parents=True, exist_ok=True)
            memory = in_memory(node_dir)
            try:
                make_view(node_dir, shared, memory=memory)
            except OSError:
                if memory:
                    raise
                # The run dir's filesystem cannot be an upper layer (NFS, an overlay root):
                # the node's writes go to memory instead.
                setns(home, CLONE_NEWNS)
                make_view(node_dir, shared, memory=True)
            view = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            answer, fds = f"err {name} {exc}", []
        else:
            answer, fds = f"ok {name}", [view]
        finally:
            setns(home, CLONE_NEWNS)
        _send(sock, answer, fds)
        for fd in fds:
            os.close(fd)
    return 0


def main(argv: Sequence[str]) -> int:
    """`python -I node_view.py FD`: the request (JSON) on stdin, answers on the inherited
    socket FD."""
    sock = socket.socket(fileno=int(argv[0]))
    request = json.loads(sys.stdin.read())
    os.chdir("/")  # setns resets it anyway; a cwd under /tmp must not pin anything
    try:
        return serve(sock, request)
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the controller is gone: nobody wants the views


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
