"""Service kinds: what a `type:` brings (default command, phase, placement, metrics).

Kinds register themselves by name, like srtctl's `@register_service`. Each kind lives in its
own module here; importing the package registers them all.
"""

from __future__ import annotations

from srtr.resources.kinds import cache, discovery, exporters, generic, gms, ray
from srtr.resources.kinds.base import KINDS, Kind, Options, get_kind, register

__all__ = [
    "KINDS",
    "Kind",
    "Options",
    "cache",
    "discovery",
    "exporters",
    "generic",
    "get_kind",
    "gms",
    "ray",
    "register",
]
