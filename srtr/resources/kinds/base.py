"""The kind contract and its registry.

A kind is a frozen value, not a class hierarchy, because a kind here only supplies defaults
(reference §2.1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Options = Mapping[str, Any]


@dataclass(frozen=True)
class Kind:
    name: str
    default_command: Callable[[Options], list[str]] | None = None
    default_start: str = "after_frontend"
    default_critical: bool = False
    default_placement: str = "head"
    option_keys: tuple[str, ...] = ()
    default_metrics_port: Callable[[Options], int] | None = None
    # The endpoint name's stem in the targets file, `<prefix>_<node>` (reference S-36
    # `metrics_endpoint_prefix`, S-110); None: the service name.
    metrics_prefix: str | None = None
    binary: str | None = None

    @property
    def needs_command(self) -> bool:
        return self.default_command is None


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> Kind | None:
    return KINDS.get(name)


def port_option(options: Options, default: int) -> int:
    value = options.get("port", default)
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else default
