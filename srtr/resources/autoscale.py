"""Autoscaled pools (`nodes: {min, max, from}`): the pure half.

The controller reads the count a pool's instance 0 publishes (`net.published`), and
`decide` says whether the pool changes size now: the count clamped to [min, max], and no
change within `cooldown_seconds` of the last one (against flapping). A change goes through
the live-edit path: the recipe is planned again with the pool's size set (`with_sizes`), so
growing past the allocation asks for nodes and shrinking gives them back, as an edit would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from srtr.resources.counts import parse_count
from srtr.resources.recipe import Autoscale, Recipe


def describe_scale(scale: Autoscale) -> str:
    """`2..32 from http :8000/desired every 10s`, for `srtr plan`."""
    source = scale.source
    where = f"http :{source.http.port}{source.http.path}" if source.http else f"file {source.file}"
    return f"{scale.min}..{scale.max} from {where} every {scale.interval_seconds:g}s"


def source_url(scale: Autoscale, ip: str) -> str:
    """Where the count is read: the URL on instance 0's node, or the file's path."""
    http = scale.source.http
    return f"http://{ip}:{http.port}{http.path}" if http is not None else str(scale.source.file)


def with_sizes(recipe: Recipe, sizes: Mapping[str, int]) -> Recipe:
    """`recipe` with the autoscaled pools in `sizes` at that size, clamped to their bounds
    (the recipe may have changed them since); other services as written."""
    services = []
    for service in recipe.services:
        scale = service.autoscale
        if scale is not None and service.name in sizes:
            size = min(max(sizes[service.name], scale.min), scale.max)
            service = service.model_copy(update={"nodes": size})
        services.append(service)
    return recipe.model_copy(update={"services": services})


__all__ = ["Decision", "decide", "describe_scale", "parse_count", "source_url", "with_sizes"]


@dataclass(frozen=True)
class Decision:
    size: int  # the pool's size from now on
    desired: int  # what was published, before clamping


def decide(
    scale: Autoscale,
    current: int,
    published: int,
    *,
    now: float,
    last_change: float | None,
) -> Decision | None:
    """The new size of a pool of `current` nodes whose instance 0 published `published`,
    or None: no change, or too soon after the last one (`last_change`, same clock)."""
    size = min(max(published, scale.min), scale.max)
    if size == current:
        return None
    if last_change is not None and now - last_change < scale.cooldown_seconds:
        return None
    return Decision(size, published)
