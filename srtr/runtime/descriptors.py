"""The controller's descriptor budget: the soft limit raised, and a job that cannot fit refused.

A process inherits a soft RLIMIT_NOFILE of 1,024 on most hosts while its hard limit is far
higher; Go servers and systemd units raise the soft one to the hard one at start, and so does
the controller (`raise_soft_limit`). Then `check` refuses, with one line before anything
starts, a job whose instances and nodes need more than the hard limit allows: such a job
would fail later, on a relaunch (`cannot open log: Too many open files`), or at its agents'
connections, with its restart budget spent in a second.

The estimate is the backend's (`Capabilities.descriptors`: per node and per instance, in
each of the controller's two descriptor tables, which the limit bounds one by one), plus a
base for the run files, the event loop and the control and metrics listeners' unauthenticated
connections at their caps (`listen_gate`), so that a flood of idle connections cannot take
what relaunches need.
"""

from __future__ import annotations

import resource

from srtr.backends.base import Descriptors
from srtr.resources.errors import Problem, RecipeError
from srtr.resources.objects import DesiredState

# Run files, the loop, stdio, and the control and metrics listeners' caps on unproved
# connections (64 and 16). The agent channel's (1,024 each on its two ports) are not counted:
# a job on a host whose hard limit is that low still runs, and a flood there waits in the
# backlog once the cap or the limit is reached.
BASE = 256 + 64 + 16
# The exit watcher's table: its sockets to the event loops, and a margin.
WATCHER_BASE = 32


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


def needed(instances: int, nodes: int, per: Descriptors) -> int:
    """The descriptors the fuller of the controller's two tables needs."""
    main = BASE + per.per_node * nodes + per.per_instance * instances
    watched = WATCHER_BASE + per.watched_per_node * nodes + per.watched_per_instance * instances
    return max(main, watched)


def check(instances: int, nodes: int, per: Descriptors, where: str = "srtr up") -> None:
    """Raise the soft limit; refuse (RecipeError, one line) a job that needs more."""
    limit = raise_soft_limit()
    need = needed(instances, nodes, per)
    if limit != resource.RLIM_INFINITY and need > limit:
        message = (
            f"{instances} instance(s) on {nodes} node(s) need about {need} open files, more "
            f"than this host allows (RLIMIT_NOFILE {limit}); raise `ulimit -Hn` or run "
            "fewer nodes or instances"
        )
        raise RecipeError(where, [Problem((), message)])


def check_desired(desired: DesiredState, per: Descriptors) -> None:
    check(len(desired.instances), len(desired.nodes.allocation), per)
