"""The kind contract and its registry.

A kind is a frozen value, not a class hierarchy, because a kind here only supplies defaults:
those of srtctl's service of the same type (docs/design/srtctl-parity.md, "Kinds").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from srtr.resources.readiness import FileProbe, HttpProbe, LogProbe, Readiness, TcpProbe

if TYPE_CHECKING:
    from srtr.resources.objects import ProbeSpec
    from srtr.resources.recipe import Recipe, Service

Options = Mapping[str, Any]
# A kind's own rule on one service: (path below `services[i]`, message) per problem.
KindProblem = tuple[tuple[str | int, ...], str]
KindRule = Callable[["Service", "Recipe"], list[KindProblem]]
# Env a kind brings; values may hold placeholders, rendered per instance like recipe env.
KindEnv = Callable[["Service", "Recipe"], dict[str, str]]


@dataclass(frozen=True)
class Requirement:
    part: Literal["node", "per"]
    value: str
    message: str


@dataclass(frozen=True)
class Kind:
    name: str
    default_command: Callable[[Options], list[str]] | None = None
    default_start: str = "after_frontend"
    default_critical: bool = False
    default_placement: str = "head"
    option_keys: tuple[str, ...] = ()
    default_metrics_port: Callable[[Options], int] | None = None
    # The endpoint name's stem in the targets file, `<prefix>_<node>` (srtctl's
    # `metrics_endpoint_prefix`); None: the service name.
    metrics_prefix: str | None = None
    binary: str | None = None
    # The hooks of srtctl's services that srtr needs for the cache/GPU kinds, as data. Each is
    # optional, so a kind that does not care stays one line.
    default_readiness: Callable[[Options], Readiness] | None = None
    default_per: str = "node"
    default_env: KindEnv | None = None  # the recipe's env overrides these
    forced_env: KindEnv | None = None  # these override the recipe's env
    default_srun_options: Callable[[Options], dict[str, str]] | None = None  # recipe's win
    default_preamble: Callable[[Options], str | None] | None = None  # runs before the recipe's
    validate: KindRule | None = None
    # The one placement the kind runs with, checked by the recipe rules against the resolved
    # placement (a kind rule sees only what was written): which part (`node` or `per`), the
    # value, and the message (`{name}` is the service's name).
    requires: Requirement | None = None
    # A service of this kind without `container` borrows that of the first enabled service
    # of this type (mooncake-store runs in the master's image).
    container_from: str | None = None
    # A Python module the default command runs (`python -m <module>`); missing on the host,
    # the instance is skipped like a missing `binary`.
    module: str | None = None
    # Discovery-plane (infra-class) kinds (`supports_dedicated`, `supports_external`):
    # `placement.node: dedicated` reserves the infra node; `external:`
    # points at an instance that runs elsewhere, and nothing is launched.
    supports_dedicated: bool = False
    supports_external: bool = False
    # The only placements the kind accepts; empty: any (etcd/nats live on the infra node).
    placements: tuple[str, ...] = ()
    # What the kind tells every other process of the job (the first env layer): the variable and its
    # value for an instance on the host with this IP, e.g. ETCD_ENDPOINTS=http://<ip>:2379.
    # Kinds with one never receive discovery env themselves.
    discovery: Callable[[str, Options], tuple[str, str]] | None = None
    # Files the runtime writes into the run dir before any instance of the kind launches
    # (path relative to the run dir, content): a config the command names.
    run_files: tuple[tuple[str, str], ...] = ()
    # --- per-instance shape (cluster kinds such as ray) ---
    # The argv of instance `index` (0 is the head), replacing `default_command`; placeholders
    # such as {pool_ip} and {node_ip} are rendered per instance as usual.
    instance_command: Callable[[Options, int], list[str]] | None = None
    # The default readiness probe of instance `index` (a recipe's `readiness` overrides it).
    instance_probe: Callable[[Options, int], ProbeSpec] | None = None
    # The fleet gate: (port, path) on the head polled once every instance is ready; the
    # stage holds until every instance shows up there.
    fleet: Callable[[Options], tuple[int, str]] | None = None

    @property
    def needs_command(self) -> bool:
        return self.default_command is None and self.instance_command is None


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> Kind | None:
    return KINDS.get(name)


def port_option(options: Options, default: int, key: str = "port") -> int:
    value = options.get(key, default)
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else default


def check_positive_ints(options: Options, keys: tuple[str, ...], upper: int = 0) -> list[str]:
    """`options.<key> must be a positive integer` for each given key that is not one."""
    out = []
    for key in keys:
        if key not in options:
            continue
        value = options[key]
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if ok and upper and value > upper:
            out.append(f"options.{key} must be between 1 and {upper}; got {value}")
        elif not ok:
            out.append(f"options.{key} must be a positive integer; got {value!r}")
    return out


def options_rule(check: Callable[[Options], list[str]]) -> KindRule:
    """A `validate` rule from a check of the options alone: its messages are about `options`."""
    return lambda service, recipe: [(("options",), m) for m in check(service.options)]


# Default probes a kind brings; built like a recipe's `readiness:` block.


def tcp_probe(port: int, timeout: float = 120.0) -> Readiness:
    return Readiness(tcp=TcpProbe(port=port), timeout_seconds=timeout)


def http_probe(port: int, path: str, timeout: float = 120.0) -> Readiness:
    return Readiness(http=HttpProbe(port=port, path=path), timeout_seconds=timeout)


def file_probe(path: str) -> Readiness:
    return Readiness(file=FileProbe(path=path))


def log_probe(pattern: str, timeout: float, interval: float) -> Readiness:
    return Readiness(
        log=LogProbe(pattern=pattern), timeout_seconds=timeout, interval_seconds=interval
    )
