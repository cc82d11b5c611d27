"""A service's per-node `setup`, and everything that runs before its instances launch.

Pure: `before_launch` gives the SETUP instances of a service and their stages, in order:
the `source` clone and the `build_command` (once, on the first node: setup_steps.py), then
one `setup` step per node of the service (`setup_<service>_<node>`), all of them in one
stage `<phase>/<service>.setup` before the service's own. The job controller's stage gate
fails the job when one exits non-zero or outlives `setup_timeout_seconds`
(decisions.setup_gate), as it does for a build.

One stage for every node, not a gate per node: the stage machinery already launches the
steps, names the failure and its log, holds a live edit's new members until the earlier
stages' new members are up (so a node a grow or a replacement brings runs its setup before
its instance), and `srtr plan` shows it in the launch order. A failed setup fails the job
anyway, so an instance started early on a node whose setup was done would only be stopped
again; the cost is that a fast node waits for the slowest setup, as any stage waits for its
slowest member.
"""

from __future__ import annotations

from collections.abc import Callable

from srtr.resources import placeholders
from srtr.resources.objects import DesiredState, InstanceKind, InstanceSpec, Stage
from srtr.resources.recipe import Service
from srtr.resources.setup_steps import STEP_TEXT, one_shot, setup_steps, workdir

# The placeholder values of one node of the service: (node, its index) -> values.
NodeValues = Callable[[str, int], dict[str, str]]

SETUP_TYPE = "setup"


def log_path(service: str, node: str) -> str:
    return f"logs/setup_{service}_{node}.out"


def before_launch(
    service: Service,
    made: list[InstanceSpec],
    phase: str,
    values_of: NodeValues,
    warnings: list[str],
) -> tuple[list[InstanceSpec], list[Stage]]:
    """The SETUP instances of `service`, whose instances are `made`, and their stages."""
    steps = setup_steps(service, made[0], phase)
    stages = [Stage(step.stage, phase, (step.name,)) for step in steps]
    if service.source is not None and service.build_command is None:
        warnings.append(
            f"services[{service.name}]: source is cloned but no build_command builds it"
        )
    per_node = node_setup_steps(service, made, phase, values_of)
    if per_node:
        steps += per_node
        stages.append(Stage(per_node[0].stage, phase, tuple(s.name for s in per_node)))
    return steps, stages


def node_setup_steps(
    service: Service, made: list[InstanceSpec], phase: str, values_of: NodeValues
) -> list[InstanceSpec]:
    """One `setup` step per node of `made` (a node with several instances runs it once), in
    the service's container and environment as its first instance there has them, with the
    text's placeholders rendered for that node; in the checkout when the service has
    `source`. The service's preamble is not run: the setup is a shell text of its own."""
    text = service.setup
    if text is None:
        return []
    firsts: dict[str, InstanceSpec] = {}
    for spec in made:
        firsts.setdefault(spec.node, spec)
    where = workdir(service)
    steps = []
    for index, (node, first) in enumerate(firsts.items()):
        steps.append(
            one_shot(
                first,
                name=f"setup_{service.name}_{node}",
                type=SETUP_TYPE,
                index=index,
                argv=(placeholders.render(text, values_of(node, index)),),
                log=log_path(service.name, node),
                stage=f"{phase}/{service.name}.setup",
                preamble=f"cd {where}" if where else None,
                shell=True,
                run_timeout_seconds=service.setup_timeout_seconds,
            )
        )
    return steps


def step_text(spec: InstanceSpec) -> str:
    """What a failed or timed-out step is called in the job's reason: a per-node setup
    with its node, since each node has its own."""
    if spec.type == SETUP_TYPE:
        return f"setup on {spec.node}"
    return STEP_TEXT[spec.type]


def per_node(spec: InstanceSpec) -> bool:
    """Whether `spec` is a per-node setup step."""
    return spec.kind is InstanceKind.SETUP and spec.type == SETUP_TYPE


def setup_refusals(old: DesiredState, new: DesiredState) -> list[str]:
    """Why a live edit may not add `setup` to a service that runs: its instances run
    already, so the setup would not run before them. (Taking it away is fine: the nodes the
    service gains later run none.)"""
    running = _services(old) & _services(new)
    before = {s.service for s in old.instances if per_node(s)}
    after = {s.service for s in new.instances if per_node(s)}
    return [
        f"services[{service}].setup cannot be added while the service runs; add it in a new run"
        for service in sorted((after - before) & running)
    ]


def _services(state: DesiredState) -> set[str]:
    return {s.service for s in state.instances if s.kind is not InstanceKind.SETUP}
