"""The recipe schema: what a user may write in recipe.yaml, as pydantic v2 models.

Field-level rules (types, ranges, vocabularies) live here, with srtctl's message key words,
so that a recipe written for it gets the same complaints. Rules that relate several fields
or the whole recipe live in `rules.py`, so that all of them can be reported at once. Every
model forbids unknown keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from srtr.resources.depends_on import Dependency, depends_on_form
from srtr.resources.limits import Limits
from srtr.resources.liveness import Liveness
from srtr.resources.readiness import FileProbe, HttpProbe, LogProbe, Readiness, TcpProbe
from srtr.resources.source import Source, is_commit
from srtr.resources.spec import (
    MAX_NODES,
    PositiveSeconds,
    Spec,
    Text,
    check_argv,
    check_env,
    check_name,
    check_port,
)

# The probe and source models live in their own modules; they stay importable from here,
# where every other part of the schema is.
__all__ = [
    "MAX_NODES",
    "FileProbe",
    "HttpProbe",
    "LogProbe",
    "Readiness",
    "Source",
    "Spec",
    "TcpProbe",
    "Text",
    "is_commit",
]

PLACEMENT_NODES = (
    "head",
    "infra",
    "dedicated",
    "prefill",
    "decode",
    "agg",
    "workers",
    "compute",
    "all",
)
PLACEMENT_PER = ("node", "worker")
START_PHASES = ("infra", "before_workers", "with_workers", "after_frontend")
RESTART_POLICIES = ("never", "on-failure", "always")


class Placement(Spec):
    node: str | None = None
    pool: str | None = None
    per: str | None = None  # None: `node`, or the kind's default when no placement is written

    @field_validator("node")
    @classmethod
    def _node(cls, v: str | None) -> str | None:
        if v is not None and v not in PLACEMENT_NODES:
            raise ValueError(
                f"placement.node must be one of {', '.join(PLACEMENT_NODES)}; got '{v}'"
            )
        return v

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("placement.pool must name a service that declares nodes")
        return v

    @field_validator("per")
    @classmethod
    def _per(cls, v: str | None) -> str | None:
        if v is not None and v not in PLACEMENT_PER:
            raise ValueError(f"placement.per must be one of {', '.join(PLACEMENT_PER)}; got '{v}'")
        return v


class Metrics(Spec):
    """A Prometheus scrape annotation."""

    port: int
    path: str = "/metrics"
    nodes: str = "all"
    name: str | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return check_port(v, "metrics.port")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("metrics.path must start with '/'")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: str) -> str:
        if v not in ("all", "first"):
            raise ValueError(f"metrics.nodes must be all or first; got '{v}'")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("metrics.name must not be empty")
        return v


class RestartPolicy(Spec):
    """When and how fast an instance is relaunched (srtr's own; srtctl had none)."""

    policy: Literal["never", "on-failure", "always"] = "on-failure"
    backoff_seconds: float = Field(default=1.0, ge=0)
    max_backoff_seconds: float = Field(default=60.0, ge=0)
    reset_after_seconds: PositiveSeconds = 600.0
    max_restarts: int = Field(default=10, ge=0)
    window_seconds: PositiveSeconds = 1800.0
    # `pool`: a failure of any instance of the owner's pool restarts the whole pool.
    scope: Literal["instance", "pool"] = "instance"

    @model_validator(mode="before")
    @classmethod
    def _word(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in RESTART_POLICIES:
                raise ValueError(
                    f"restart must be one of {', '.join(RESTART_POLICIES)} or a mapping; "
                    f"got '{value}'"
                )
            return {"policy": value}
        return value

    @model_validator(mode="after")
    def _cap(self) -> RestartPolicy:
        if self.max_backoff_seconds < self.backoff_seconds:
            raise ValueError(
                "restart.max_backoff_seconds must be >= backoff_seconds; got "
                f"{self.max_backoff_seconds:g} < {self.backoff_seconds:g}"
            )
        return self


class ScaleHttp(Spec):
    """`GET http://<instance 0's node IP>:<port><path>` answers the desired node count."""

    port: int
    path: str = "/"

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return check_port(v, "nodes.from.http.port")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("nodes.from.http.path must start with '/'")
        return v


class ScaleSource(Spec):
    """Where a pool's instance 0 publishes the node count it wants: exactly one of these."""

    http: ScaleHttp | None = None
    file: str | None = None

    @field_validator("file")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"nodes.from.file must be an absolute path; got {v!r}")
        return v

    @model_validator(mode="after")
    def _one(self) -> ScaleSource:
        given = [k for k in ("http", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            got = ", ".join(given) or "none"
            raise ValueError(f"nodes.from needs exactly one of http or file; got {got}")
        return self


class Autoscale(Spec):
    """`nodes: {min, max, from}`: the pool's size follows the count its instance 0
    publishes, within [min, max] (docs/recipe.md "Autoscaled pools")."""

    model_config = ConfigDict(populate_by_name=True)

    min: int = Field(ge=1, le=MAX_NODES)
    max: int = Field(ge=1, le=MAX_NODES)
    source: ScaleSource = Field(alias="from")
    interval_seconds: float = Field(default=10.0, gt=0)
    cooldown_seconds: float = Field(default=30.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if self.max < self.min:
            raise ValueError(f"max must be >= min; got {self.max} < {self.min}")
        return self


class Leader(Spec):
    """`leader:` of an owner: what its pool's instance 0 runs instead (a scheduler, a
    coordinator), as LeaderWorkerSet's leader template. Each field given replaces the
    service's for instance 0 (`env` is merged over the service's); `start: first` launches
    the leader and waits for its readiness before the other instances, `together` launches
    all at once."""

    command: list[Text] | None = None
    args: list[Text] | None = None
    env: dict[str, Text] = {}
    readiness: Readiness | None = None
    liveness: Liveness | None = None
    start: Literal["first", "together"] = "first"

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        return check_argv(v)

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not part for part in v):
            raise ValueError("leader.args must not contain empty arguments")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


class Service(Spec):
    """One entry of `services:` (srtctl's keys, plus restart/shutdown_tier/stop_grace)."""

    name: str
    type: str = "generic"
    command: list[Text] | None = None
    args: list[Text] = []
    container: str | None = None
    env: dict[str, Text] = {}
    placement: Placement | None = None
    nodes: int | None = None
    start: str | None = None
    readiness: Readiness | None = None
    liveness: Liveness | None = None
    critical: bool | None = None
    terminal: bool = False
    preamble: str | None = None
    cpus_per_task: int | None = None
    cpu_bind: str | None = None
    srun_options: dict[str, Text] = {}
    limits: Limits | None = None  # per instance (`limits.py`)
    enabled: bool = True
    options: dict[str, Any] = {}
    metrics: list[Metrics] = []
    restart: RestartPolicy | None = None
    shutdown_tier: int | None = Field(default=None, ge=0)
    stop_grace_seconds: float = Field(default=30.0, ge=0)
    replace_lost: bool = False
    # Discovery plane: an already-running instance's address instead
    # of a launched one, and whether this service gets ETCD_ENDPOINTS / NATS_SERVER.
    external: str | None = None
    inherit_discovery_env: bool = True
    # Clone and build before launch; see docs/recipe.md "source".
    source: Source | None = None
    build_command: list[Text] | None = None
    build_timeout_seconds: float = 1800.0
    # Shell text run once on every node of the service before its first instance there.
    setup: str | None = None
    setup_timeout_seconds: float = 1800.0
    # Env that must reach the instance through srun's --export.
    srun_export_env: dict[str, Text] = {}
    # `nodes: {min, max, from}` as written; `nodes` is then the pool's size now (`min`
    # until the controller scales it). Not a key of its own in a recipe.
    autoscale: Autoscale | None = None
    # What the pool's instance 0 runs instead (owners only; rules.py says so).
    leader: Leader | None = None
    # What it waits for before it starts (`depends_on.py`); empty: the phases' order.
    depends_on: dict[str, Dependency] = {}

    @field_validator("depends_on", mode="before")
    @classmethod
    def _depends_on(cls, v: Any) -> Any:
        return depends_on_form(v)

    @model_validator(mode="before")
    @classmethod
    def _autoscaled_nodes(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if "autoscale" in data:
            raise ValueError(
                "unknown key 'autoscale' (an autoscaled pool says nodes: {min, max, from})"
            )
        nodes = data.get("nodes")
        if isinstance(nodes, dict):
            low = nodes.get("min")
            return {**data, "autoscale": nodes, "nodes": low if isinstance(low, int) else 1}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "name")

    @field_validator("external")
    @classmethod
    def _external(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("external must be a non-empty endpoint")
        return v

    @field_validator("build_command")
    @classmethod
    def _build_command(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("if set, must be non-empty (omit it entirely instead)")
        if v is not None and any(not part for part in v):
            raise ValueError("build_command must not contain empty arguments")
        return v

    @field_validator("build_timeout_seconds", "setup_timeout_seconds")
    @classmethod
    def _step_timeout(cls, v: float, info: ValidationInfo) -> float:
        if v <= 0:
            raise ValueError(f"{info.field_name} must be positive")
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("if set, must be non-empty shell text (omit it entirely instead)")
        return v

    @field_validator("srun_export_env")
    @classmethod
    def _export_env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        return check_argv(v)

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        if any(not part for part in v):
            raise ValueError("command/args must not contain empty arguments")
        return v

    @field_validator("start")
    @classmethod
    def _start(cls, v: str | None) -> str | None:
        if v is not None and v not in START_PHASES:
            raise ValueError(f"start must be one of {', '.join(START_PHASES)}; got '{v}'")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"nodes must be at least 1; got {v}")
        if v is not None and v > MAX_NODES:
            raise ValueError(f"nodes must be at most {MAX_NODES}; got {v}")
        return v

    @field_validator("cpus_per_task")
    @classmethod
    def _cpus(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError("cpus_per_task must be positive")
        return v

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


class Role(Spec):
    """An engine role: owns `nodes`, runs `command` once per worker (none: only holds nodes)."""

    nodes: int = Field(ge=1, le=MAX_NODES)
    workers: int | None = Field(default=None, ge=1, le=MAX_NODES * 64)
    gpus: int = Field(default=0, ge=0)
    command: list[Text] | None = None
    env: dict[str, Text] = {}
    readiness: Readiness | None = None
    restart: RestartPolicy | None = None
    stop_grace_seconds: float = Field(default=30.0, ge=0)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        return check_argv(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


class Roles(Spec):
    prefill: Role | None = None
    decode: Role | None = None
    agg: Role | None = None


class Resources(Spec):
    gpus_per_node: int = Field(default=8, ge=0)
    het_jobs: bool = False
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    # `live-edit`: a live edit may grow a pool past the spare nodes by asking the backend's
    # provisioner for more; `never` refuses it.
    grow: Literal["never", "live-edit"] = "live-edit"
    # The cap on the run's nodes, the allocation and every provisioned node together.
    max_nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)


class Frontend(Spec):
    """`generic` runs `command` (if any) on the head node once the workers are ready."""

    type: Literal["none", "generic"] | None = None
    command: list[Text] | None = None
    readiness: Readiness | None = None
    dedicated_node: bool = False
    stop_grace_seconds: float = Field(default=30.0, ge=0)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        return check_argv(v)


class Benchmark(Spec):
    type: Literal["manual", "custom"] = "manual"
    command: str | None = None
    env: dict[str, Text] = {}
    client_dedicated_node: bool = False

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @model_validator(mode="after")
    def _command_for_custom(self) -> Benchmark:
        if self.type == "custom" and not (self.command and self.command.strip()):
            raise ValueError("benchmark.type: custom needs a command")
        return self


class Observability(Spec):
    exporters: bool = False


class Recipe(Spec):
    """The whole recipe file."""

    name: str
    resources: Resources = Resources()
    roles: Roles = Roles()
    frontend: Frontend = Frontend()
    services: list[Service] = []
    benchmark: Benchmark = Benchmark()
    environment: dict[str, Text] = {}
    observability: Observability = Observability()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "name")

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema, including the short forms the loader accepts.

    pydantic describes the validated shape; the loader also takes `restart: on-failure` and
    a single `metrics:` mapping, so editors must not flag those.
    """
    schema = Recipe.model_json_schema()

    def patch(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in list(node.items()):
                if key == "restart" and isinstance(value, dict) and value.get("type") != "boolean":
                    value.setdefault("anyOf", []).append({"enum": list(RESTART_POLICIES)})
                elif key == "metrics" and isinstance(value, dict) and value.get("type") == "array":
                    node[key] = {"anyOf": [value, value["items"]], "default": []}
                elif key == "depends_on" and isinstance(value, dict) and "type" in value:
                    # the list form, and a name with no settings (`scheduler:`)
                    value["additionalProperties"] = {
                        "anyOf": [value["additionalProperties"], {"type": "null"}]
                    }
                    names = {"type": "array", "items": {"type": "string"}}
                    node[key] = {"anyOf": [value, names], "default": {}}
                else:
                    patch(value)
        elif isinstance(node, list):
            for item in node:
                patch(item)

    patch(schema.get("$defs", {}))
    # `name` defaults to the recipe file's stem (loading.default_name): optional in a file.
    schema["required"] = [key for key in schema.get("required", []) if key != "name"]
    if not schema["required"]:
        del schema["required"]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "srtr recipe"
    return schema
