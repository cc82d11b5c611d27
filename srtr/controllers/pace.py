"""How soon one instance's change may wake a key that looks at every instance.

The job's reconcile (stage gates, failure checks), a pool's (readiness counts) and the
teardown's (who is due a signal) each look at the whole job or pool. Woken by every
instance's change, a big job ran them once per batch of launch answers or exits: at 80,000
instances, ~80 ms each, about a thousand times a stage. Woken through `wake`, they run a
moment later, longer the bigger the job, and see every change of that moment at once.
Below `PACED_FROM` instances a wake is immediate, as before: small jobs react at once.
"""

from __future__ import annotations

from srtr.controllers.context import Ctx

PACED_FROM = 2_000  # instances
SECONDS_PER_INSTANCE = 4e-6  # ~4 x what the job's reconcile costs per instance
MAX_PACE = 0.5  # s


def pace(instances: int) -> float:
    """How long a wake waits in a job of `instances` instances."""
    if instances < PACED_FROM:
        return 0.0
    return min(instances * SECONDS_PER_INSTANCE, MAX_PACE)


def wake(ctx: Ctx, key: str) -> None:
    """Queue `key` after the job's pace (a sooner request for it still counts)."""
    ctx.queue.add_after(key, pace(len(ctx.store.specs)))


def wake_first(ctx: Ctx, key: str) -> None:
    """Queue `key` at once, unless this did so within the job's pace: then after the pace,
    as `wake`. For a change that is likely the last of its moment (a stage's last launch
    answer in flight, whose job reconcile opens the next stage: paced, each of a 10,000-node
    job's eight stages waited 0.32 s for it), never more than twice a pace."""
    wait = pace(len(ctx.store.specs))
    now = ctx.clock.now()
    if now - ctx.woken_at.get(key, float("-inf")) >= wait:
        ctx.woken_at[key] = now
        ctx.queue.add(key)
    else:
        ctx.queue.add_after(key, wait)
