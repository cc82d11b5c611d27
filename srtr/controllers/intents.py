"""Intents: what a user may ask of a running job (TUI keys, `srtr down`, signals).

An intent never changes a process itself: it records what the user wants in the store and
enqueues the keys whose controllers then act. Each function returns a short message for the
user, or raises IntentError with the reason it was refused.
"""

from __future__ import annotations

import signal

from srtr.controllers import edits, job
from srtr.controllers.context import TEARDOWN, Ctx, instance_key
from srtr.reconciler.store import JobPhase, UserAction

OPS = ("teardown", "interrupt", "kill", "restart", "stop", "apply", "discard", "lose-node")


class IntentError(Exception):
    """The intent was refused; the message says why."""


def _running(ctx: Ctx) -> None:
    if ctx.store.job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        raise IntentError(f"the job has ended ({ctx.store.job.phase})")


def _instance(ctx: Ctx, name: str | None) -> str:
    if not name or name not in ctx.store.specs:
        raise IntentError(f"no instance named {name!r}")
    return name


def teardown(ctx: Ctx, *, by: str = "user", signum: int = signal.SIGTERM) -> str:
    """Tear down tier by tier; the job exits 128 + `signum`, as if that signal had stopped it.

    `srtr down` and the TUI's `T` stand for SIGTERM (143); Ctrl+C in the TUI for SIGINT
    (130), the same code as Ctrl+C in a headless `srtr up`.
    """
    _running(ctx)
    if ctx.store.job.teardown_requested:
        return "already tearing down"
    job.begin_teardown(ctx, exit_code=128 + signum, reason=f"torn down by {by}")
    return "tearing down tier by tier"


def kill(ctx: Ctx) -> str:
    _running(ctx)
    if not ctx.store.job.teardown_requested:
        job.begin_teardown(ctx, exit_code=128 + signal.SIGKILL, reason="killed by user")
    ctx.store.request_kill()
    ctx.queue.add(TEARDOWN)
    return "killing every instance now"


def restart(ctx: Ctx, name: str | None) -> str:
    """Stop the instance (SIGTERM, SIGKILL after its grace) and start it again at once."""
    _running(ctx)
    name = _instance(ctx, name)
    if ctx.store.job.teardown_requested:
        raise IntentError("the job is tearing down")
    status = ctx.store.status[name]
    if not status.activated or status.attempt < 0:
        reason = status.conditions.get("Ready")
        if reason is not None and reason.reason == "Skipped":
            raise IntentError(f"{name} was skipped: {reason.message}")
        raise IntentError(f"{name} has not been launched yet")
    ctx.store.request(name, UserAction.RESTART)
    ctx.queue.add(instance_key(name))
    return f"restarting {name}"


def stop(ctx: Ctx, name: str | None) -> str:
    """Stop the instance for good (until the job ends): no restart policy applies."""
    _running(ctx)
    name = _instance(ctx, name)
    ctx.store.request(name, UserAction.STOP)
    ctx.queue.add(instance_key(name))
    return f"stopping {name}"


def lose_node(ctx: Ctx, node: str | None) -> str:
    """Fail a simulated node (local backend only), to see node loss without a cluster.

    Unlike the other intents this one acts at once: it stands for the world failing, not for
    a wish about the job. The backend kills the node's instances and reports them Lost, as
    the SLURM backend does for a node that went DOWN; the controllers then react as they
    would on SLURM (replace_lost, critical failure).
    """
    _running(ctx)
    if not ctx.backend.capabilities.simulated_nodes:
        raise IntentError(f"the {ctx.backend.name} backend has no simulated nodes to lose")
    try:
        taken = ctx.backend.lose_node(node or "")
    except ValueError as exc:
        raise IntentError(str(exc)) from None
    message = f"node {node} lost (simulated): {len(taken)} instance(s) killed"
    ctx.store.record("job", "NodeLost", message, warning=True)
    return message


def handle(ctx: Ctx, op: str, instance: str | None = None, node: str | None = None) -> str:
    if op == "teardown":
        return teardown(ctx)
    if op == "interrupt":
        return teardown(ctx, by="Ctrl+C", signum=signal.SIGINT)
    if op == "kill":
        return kill(ctx)
    if op == "restart":
        return restart(ctx, instance)
    if op == "stop":
        return stop(ctx, instance)
    if op == "lose-node":
        return lose_node(ctx, node)
    if op in ("apply", "discard"):
        _running(ctx)
        try:
            return edits.apply_pending(ctx) if op == "apply" else edits.discard_pending(ctx)
        except LookupError as exc:
            raise IntentError(str(exc)) from None
    raise IntentError(f"unknown intent {op!r}; known: {', '.join(OPS)}")
