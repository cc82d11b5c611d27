"""A simulated node's own temp dir on the local backend: "a node is a node" (issue #13 part 5).

Multi-node software assumes one host per node: Ray keeps its session, sockets and
`ray_current_cluster` under /tmp/ray, etcd and NATS put their data dirs under /tmp. Simulated
nodes share one machine, so each gets `<run dir>/nodes/<node>/tmp`:

- `TMPDIR` points at it (programs that honour TMPDIR, Ray among them, need nothing more);
- where the kernel allows a mount namespace (root, or an unprivileged user namespace),
  every process of the node also sees that dir *as* /tmp: it runs under
  `unshare --mount --propagation private` and a bind mount over /tmp, so programs that
  hard-code /tmp are separated too. TMPDIR is then /tmp itself, which keeps Unix socket
  paths short (Ray's must fit in 107 bytes).

What a node still shares: the network namespace (nodes keep their 127.0.0.K addresses, so
a wildcard bind still takes a port on every node), /dev/shm, the process table, and every
other path. The run dir stays visible at its own path inside the private /tmp (its top-level
directory under /tmp is bound back), as a cluster's shared filesystem would be, and so does
the controller's working directory.

Instances of one node share its dir and namespace view, so a Ray driver in the benchmark
step on node 1 finds the head's sockets under /tmp/ray like on a real node.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
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

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix, self.why_not = _unshare_prefix()
        shared = {_shared_entry(root), _shared_entry(Path.cwd())}
        self.shared = sorted(s for s in shared if s is not None)
        root.mkdir(parents=True, exist_ok=True)
        mode = "private /tmp (mount namespace) and TMPDIR" if self.prefix else "TMPDIR only"
        note = f"node isolation: {mode}" + (f"; {self.why_not}" if self.why_not else "")
        (root / "isolation.txt").write_text(note + "\n")
        if self.why_not:
            log.warning("srtr: simulated nodes get TMPDIR only: %s", self.why_not)

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
