"""Discovery env: where the job's etcd and nats are, for everything else.

`ETCD_ENDPOINTS` and `NATS_SERVER` name the discovery plane's addresses: an `external:`
address as written, else the kind's URL on the node the service runs on (the infra node).
Unlike srtctl, nothing is set when the job has no etcd/nats service: srtr has no
Dynamo frontend that would imply one, so an unset variable means "none here".
Pure, like the rest of planning.
"""

from __future__ import annotations

from collections.abc import Callable

from srtr.resources.effective import Resolved

Env = list[tuple[str, str]]


def discovery_env(resolved: list[Resolved], ip_of: Callable[[Resolved], str | None]) -> Env:
    """The discovery variables of the resolved services, with `ip_of(r)` the IP one runs on."""
    env: dict[str, str] = {}
    for r in resolved:
        service, kind = r.service, r.kind
        if kind.discovery is None:
            continue
        if r.external:
            assert service.external is not None
            var, value = kind.discovery("", service.options)[0], service.external
        else:
            ip = ip_of(r)
            if ip is None:  # placed on no node: nothing runs, so nothing to point at
                continue
            var, value = kind.discovery(ip, service.options)
        env.setdefault(var, value)  # rules.py refuses a second etcd or nats
    return list(env.items())


def receives_discovery_env(resolved: Resolved) -> bool:
    """`inherit_discovery_env` (default true), never for the discovery kinds themselves."""
    return resolved.service.inherit_discovery_env and resolved.kind.discovery is None


def layered(discovery: Env, *layers: dict[str, str]) -> dict[str, str]:
    """Discovery env first, so that any recipe value for the same variable wins."""
    out = dict(discovery)
    for layer in layers:
        out.update(layer)
    return out
