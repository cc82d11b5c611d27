"""Instances of a plan that would collide on a node: two that listen on one port, two
with one name (one step name, one log file). Pure; each check costs one pass over the
instances, and none at all in the usual case (nothing listens on a known port, no name
twice), found at C speed: a plan of 80,000 instances waits on these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from srtr.resources.errors import Path, Problem
from srtr.resources.objects import InstanceKind, InstanceSpec

PathOf = Callable[..., Path]  # a service's name (and a field) -> its path in the recipe


def ports(
    instances: Sequence[InstanceSpec], metrics_ports: Mapping[str, list[int]], path_of: PathOf
) -> list[Problem]:
    """Two instances on one node that listen on one port (probe or metrics) collide.
    `metrics_ports`: the ports each service's metrics endpoints listen on."""
    problems: list[Problem] = []
    taken: dict[tuple[str, int], InstanceSpec] = {}
    reported: set[tuple[str, str, int]] = set()
    if not any(metrics_ports.values()) and not any(
        spec.probe is not None and spec.probe.port is not None for spec in instances
    ):
        return problems  # nothing listens on a port srtr knows of
    # Per service and probe port, not per instance: a pool's instances share both.
    listens: dict[tuple[str, int | None, tuple[int, ...]], list[int]] = {}
    for spec in instances:
        if spec.kind is InstanceKind.SETUP:
            continue  # a clone or build listens on nothing
        probe = spec.probe
        key = (
            (spec.service, probe.port, probe.more_ports)
            if probe is not None and probe.port is not None
            else (spec.service, None, ())
        )
        ports_of = listens.get(key)
        if ports_of is None:
            found = set(metrics_ports.get(spec.service, []))
            if key[1] is not None:
                found.update((key[1], *key[2]))
            ports_of = listens[key] = sorted(found)
        for port in ports_of:
            first = taken.setdefault((spec.node, port), spec)
            if first is spec or (first.service, spec.service, port) in reported:
                continue
            reported.add((first.service, spec.service, port))
            problems.append(
                Problem(
                    path_of(spec.service, "readiness"),
                    f"services[{first.service}] and services[{spec.service}] both listen "
                    f"on port {port} on node {spec.node}; give them disjoint placements "
                    "or ports",
                )
            )
    return problems


def names(instances: Sequence[InstanceSpec], path_of: PathOf) -> list[Problem]:
    """`service_a` on node n2 and a one-instance service `a_n2` would share a step name
    and a log file: refused rather than let one overwrite the other's output."""
    problems: list[Problem] = []
    if len({spec.name for spec in instances}) == len(instances):
        return problems  # no name twice
    seen: dict[str, str] = {}
    for spec in instances:
        other = seen.setdefault(spec.name, spec.service)
        if other != spec.service:
            problems.append(
                Problem(
                    path_of(spec.service, "name"),
                    f"instance name '{spec.name}' of services[{spec.service}] is also an "
                    f"instance of services[{other}]; rename one of them",
                )
            )
    return problems
