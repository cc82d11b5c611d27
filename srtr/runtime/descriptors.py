"""The controller's descriptor budget: the soft limit raised, and a job that cannot fit refused.

A process inherits a soft RLIMIT_NOFILE of 1,024 on most hosts while its hard limit is far
higher; Go servers and systemd units raise the soft one to the hard one at start, and so does
the controller (`raise_soft_limit`). Then `check` refuses, with one line before anything
starts, a job whose instances and nodes need more than the hard limit allows: such a job
would fail later, on a relaunch (`cannot open log: Too many open files`), with its restart
budget spent in a second.

The estimate: per instance its pidfd and its log or probe socket while one is open; per node
an agent's two connections; and a base for the run files, the event loop and the control
and metrics listeners' unauthenticated connections at their caps (`listen_gate`), so that a
flood of idle connections cannot take what relaunches need.
"""

from __future__ import annotations

import resource

from srtr.resources.errors import Problem, RecipeError
from srtr.resources.objects import DesiredState

PER_INSTANCE = 2
PER_NODE = 2
# Run files, the loop, stdio, and the control and metrics listeners' caps on unproved
# connections (64 and 16). The agent channel's (1,024 each on its two ports) are not counted:
# a job on a host whose hard limit is that low still runs, and a flood there waits in the
# backlog once the cap or the limit is reached.
BASE = 256 + 64 + 16


def raise_soft_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft
    return hard


def needed(instances: int, nodes: int) -> int:
    return BASE + PER_INSTANCE * instances + PER_NODE * nodes


def check(instances: int, nodes: int, where: str = "srtr up") -> None:
    """Raise the soft limit; refuse (RecipeError, one line) a job that needs more."""
    limit = raise_soft_limit()
    need = needed(instances, nodes)
    if limit != resource.RLIM_INFINITY and need > limit:
        message = (
            f"{instances} instance(s) on {nodes} node(s) need about {need} open files, more "
            f"than this host allows (RLIMIT_NOFILE {limit}); raise `ulimit -Hn` or run "
            "fewer instances"
        )
        raise RecipeError(where, [Problem((), message)])


def check_desired(desired: DesiredState) -> None:
    check(len(desired.instances), len(desired.nodes.allocation))
