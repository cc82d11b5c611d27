"""Intents: what a user may ask of a running job (TUI keys, `srtr down`, signals).

An intent never changes a process itself: it records what the user wants in the store and
enqueues the keys whose controllers then act. Each function returns a short message for the
user, or raises IntentError with the reason it was refused.
"""

from __future__ import annotations

import difflib
import signal
from collections.abc import Callable, Mapping

from srtr.controllers import edits, job
from srtr.controllers.context import TEARDOWN, Ctx, instance_key
from srtr.resources.objects import InstanceKind
from srtr.store.status import FINISHED
from srtr.store.store import JobPhase, Phase, UserAction

OPS = ("teardown", "interrupt", "kill", "restart", "stop", "apply", "discard", "lose-node")


class IntentError(Exception):
    """The intent was refused; the message says why."""


def _running(ctx: Ctx) -> None:
    if ctx.store.job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        raise IntentError(f"the job has ended ({ctx.store.job.phase})")


def resolve(name: str | None, services: Mapping[str, str]) -> list[str]:
    """The instances `name` stands for: that instance, or every instance of that service.

    `services` maps each instance to its service. Raises LookupError, with a did-you-mean,
    for a name that is neither (`srtr restart`/`srtr stop` check it before they ask the job).
    """
    if name and name in services:
        return [name]
    members = [n for n, service in services.items() if service == name]
    if name and members:
        return members
    known = sorted({*services, *services.values()})
    close = difflib.get_close_matches(name or "", known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise LookupError(f"no instance or service named {name!r}{hint}")


def _targets(ctx: Ctx, name: str | None) -> list[str]:
    services = {n: s.service for n, s in ctx.store.specs.items() if n not in ctx.store.removing}
    try:
        targets = resolve(name, services)
    except LookupError as exc:
        raise IntentError(str(exc)) from None
    if targets == [name]:
        return targets
    # A service stands for its instances, not for the steps that ran once before them (a
    # clone, a build, a node's setup): restarting it does not run them again.
    return [t for t in targets if ctx.store.specs[t].kind is not InstanceKind.SETUP]


def _for_each(name: str | None, targets: list[str], act: Callable[[str], str]) -> str:
    """Apply `act` to one instance (its refusal is the answer) or to every instance of a
    service (refused only when every one refuses; the others' reasons are listed)."""
    if targets == [name]:
        return act(targets[0])
    done: list[str] = []
    refused: list[str] = []
    for target in targets:
        try:
            done.append(act(target))
        except IntentError as exc:
            refused.append(str(exc))
    if not done:
        raise IntentError(f"service {name}: " + "; ".join(refused))
    skipped = f" (not: {'; '.join(refused)})" if refused else ""
    return f"service {name}: {', '.join(done)}{skipped}"


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
    """Restart an instance, or every instance of a service: stop it (SIGTERM, SIGKILL after
    its grace) and start it again at once. One that ended for good (Succeeded, Failed,
    GaveUp, Stopped) starts again with a fresh restart budget. A planned restart is no crash:
    it spends no budget and does not count in RESTARTS."""
    _running(ctx)
    targets = _targets(ctx, name)
    if ctx.store.job.teardown_requested:
        raise IntentError("the job is tearing down")
    return _for_each(name, targets, lambda target: _restart_one(ctx, target))


def _restart_one(ctx: Ctx, name: str) -> str:
    status = ctx.store.status[name]
    if not status.activated or status.attempt < 0:
        reason = status.conditions.get("Ready")
        if reason is not None and reason.reason == "Skipped":
            raise IntentError(f"{name} was skipped: {reason.message}")
        raise IntentError(f"{name} has not been launched yet")
    if status.phase is Phase.LOST:
        raise IntentError(f"{name} is Lost: its node is gone")
    if status.user_action is UserAction.RESTART:
        return f"{name} is already restarting"
    ended = f" (it was {status.phase})" if status.phase in FINISHED else ""
    ctx.store.request(name, UserAction.RESTART)
    ctx.queue.add(instance_key(name))
    return f"restarting {name}{ended}"


def stop(ctx: Ctx, name: str | None) -> str:
    """Stop an instance, or every instance of a service, for good (until the job ends, or a
    restart): no restart policy applies."""
    _running(ctx)
    targets = _targets(ctx, name)
    return _for_each(name, targets, lambda target: _stop_one(ctx, target))


def _stop_one(ctx: Ctx, name: str) -> str:
    status = ctx.store.status[name]
    if status.phase in FINISHED:
        raise IntentError(f"{name} is already {status.phase}")
    if status.user_action is UserAction.STOP:
        return f"{name} is already stopping"
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
