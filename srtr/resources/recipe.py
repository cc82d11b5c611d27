"""The recipe schema: what a user may write in recipe.yaml, as pydantic v2 models.

Field-level rules (types, ranges, vocabularies) live here, with the older system's message
key words (reference §1.3). Rules that relate several fields or the whole recipe live in
`rules.py`, so that all of them can be reported at once. Every model forbids unknown keys.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from srtr.resources.limits import Limits

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
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

PositiveSeconds = Annotated[float, Field(gt=0)]
# Far beyond any SLURM allocation, and small enough that a typo cannot make `srtr plan`
# build a billion-node allocation in memory.
MAX_NODES = 100_000


def _scalar_to_str(value: Any) -> Any:
    # YAML reads `PORT: 8000` and `["sleep", 1]` as numbers; users mean the text.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return getattr(value, "yaml_text", str(value))
    return value


Text = Annotated[
    str,
    BeforeValidator(_scalar_to_str),
    WithJsonSchema({"type": ["string", "number", "boolean"]}),
]


class Spec(BaseModel):
    """Base of every recipe model: frozen, unknown keys refused."""

    # strict: YAML's `yes` must not become 1 node, nor "8" a port; numbers stay numbers.
    # allow_inf_nan=False: YAML's `.nan` and `.inf` are floats to pydantic, and a NaN
    # timeout never expires (every comparison with it is false). Every float field of
    # every model refuses them (issue 23).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _check_name(value: str, what: str) -> str:
    if not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if not NAME_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} may only contain letters, digits, '-' and '_' "
            "(it becomes file, step and env var names)"
        )
    return value


def _check_argv(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if not value:
        raise ValueError("if set, must be non-empty (omit it to use the type's default)")
    if any(not part for part in value):
        raise ValueError("command/args must not contain empty arguments")
    return value


def _check_port(value: int, what: str) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} must be between 1 and 65535; got {value}")
    return value


class TcpProbe(Spec):
    port: int

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return _check_port(v, "readiness.tcp.port")


class HttpProbe(Spec):
    port: int
    path: str = "/health"
    status: int = 200

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return _check_port(v, "readiness.http.port")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("readiness.http.path must start with '/'")
        return v

    @field_validator("status")
    @classmethod
    def _status(cls, v: int) -> int:
        if not 100 <= v <= 599:
            raise ValueError(f"readiness.http.status must be an HTTP status code; got {v}")
        return v


class LogProbe(Spec):
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(
                f"readiness.log.pattern is not a valid regular expression: {exc}"
            ) from None
        return v


class FileProbe(Spec):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("readiness.file.path must not be empty")
        return v


class Readiness(Spec):
    """Exactly one probe, plus its timing. `port: N` is shorthand for `tcp: {port: N}`."""

    port: int | None = None
    tcp: TcpProbe | None = None
    http: HttpProbe | None = None
    log: LogProbe | None = None
    file: FileProbe | None = None
    timeout_seconds: float = 120.0
    interval_seconds: float = 2.0

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        return None if v is None else _check_port(v, "readiness.port")

    @field_validator("timeout_seconds", "interval_seconds")
    @classmethod
    def _positive(cls, v: float, info: Any) -> float:
        if v <= 0:
            raise ValueError(f"readiness.{info.field_name} must be positive; got {v:g}")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> Readiness:
        if self.port is not None and self.tcp is not None:
            raise ValueError("give either port (shorthand) or tcp, not both")
        given = [k for k in ("port", "tcp", "http", "log", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "readiness needs exactly one probe: port, tcp, http, log, or file; got "
                + (", ".join(given) if given else "none")
            )
        return self


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


# Refs that name a moving target: a checkout of them is not reproducible (reference S-07).
MUTABLE_REFS = ("main", "master", "HEAD", "develop", "trunk")
MUTABLE_REF_PREFIXES = ("refs/heads/", "origin/", "refs/remotes/")
# A full commit id: SHA-1 (40 hex) or SHA-256 (64 hex). Abbreviations cannot be pinned.
COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def is_commit(rev: str) -> bool:
    return COMMIT_RE.fullmatch(rev.lower()) is not None


class Source(Spec):
    """A git checkout cloned before the service's build and launch (reference S-07)."""

    git: str
    rev: Text
    path: str | None = None
    # The commit `rev` named when the job was submitted (srtr pins it; see resources/pins.py).
    sha: Text | None = None

    @field_validator("git")
    @classmethod
    def _git(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("source.git must name a repository URL")
        return v

    @field_validator("rev")
    @classmethod
    def _rev(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("source.rev must not be empty")
        if v in MUTABLE_REFS or v.startswith(MUTABLE_REF_PREFIXES):
            raise ValueError(
                f"source.rev '{v}' is a branch; use an immutable ref "
                "(a full commit SHA, a tag, or refs/pull/<n>/head)"
            )
        if v.startswith("-") or any(c.isspace() for c in v):
            raise ValueError(f"source.rev '{v}' is not a git ref")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or v.startswith("/") or ".." in v.split("/")):
            raise ValueError("source.path must be a relative path inside the checkout")
        return v

    @field_validator("sha")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        if v is not None and not is_commit(v):
            raise ValueError(f"source.sha '{v}' must be a full commit id (40 or 64 hex digits)")
        return v.lower() if v is not None else None

    @model_validator(mode="after")
    def _rev_is_its_own_pin(self) -> Source:
        if self.sha is not None and is_commit(self.rev) and self.sha != self.rev.lower():
            raise ValueError(f"source.sha '{self.sha}' differs from the commit source.rev names")
        return self

    @property
    def pin(self) -> str | None:
        """The commit to check out: `sha`, or `rev` when it is one; None: `rev` unpinned."""
        return self.sha or (self.rev.lower() if is_commit(self.rev) else None)


class Metrics(Spec):
    """A Prometheus scrape annotation (reference S-28)."""

    port: int
    path: str = "/metrics"
    nodes: str = "all"
    name: str | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return _check_port(v, "metrics.port")

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
    """When and how fast an instance is relaunched (srtr's own; the older system had none)."""

    policy: Literal["never", "on-failure", "always"] = "on-failure"
    backoff_seconds: float = Field(default=1.0, ge=0)
    max_backoff_seconds: float = Field(default=60.0, ge=0)
    reset_after_seconds: PositiveSeconds = 600.0
    max_restarts: int = Field(default=10, ge=0)
    window_seconds: PositiveSeconds = 1800.0

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
        return _check_port(v, "nodes.from.http.port")

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
    publishes, within [min, max] (issue 24; docs/recipe.md "Autoscaled pools")."""

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


class Service(Spec):
    """One entry of `services:` (reference §1.1, plus restart/shutdown_tier/stop_grace)."""

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
    # Discovery plane (reference S-18, S-26): an already-running instance's address instead
    # of a launched one, and whether this service gets ETCD_ENDPOINTS / NATS_SERVER.
    external: str | None = None
    inherit_discovery_env: bool = True
    # Clone and build before launch (reference S-07..S-09); see docs/recipe.md "source".
    source: Source | None = None
    build_command: list[Text] | None = None
    build_timeout_seconds: float = 1800.0
    # Env that must reach the instance through srun's --export (reference T-71).
    srun_export_env: dict[str, Text] = {}
    # `nodes: {min, max, from}` as written; `nodes` is then the pool's size now (`min`
    # until the controller scales it). Not a key of its own in a recipe.
    autoscale: Autoscale | None = None

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
        return _check_name(v, "name")

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

    @field_validator("build_timeout_seconds")
    @classmethod
    def _build_timeout(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("build_timeout_seconds must be positive")
        return v

    @field_validator("srun_export_env")
    @classmethod
    def _export_env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        return _check_argv(v)

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
        return _check_env(v)


def _check_env(v: dict[str, str]) -> dict[str, str]:
    # Every bad key at once: fixing one and running again to see the next wastes a turn.
    bad = [key for key in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)]
    if len(bad) == 1:
        raise ValueError(f"env key {bad[0]!r} is not a valid environment variable name")
    if bad:
        keys = ", ".join(repr(k) for k in bad)
        raise ValueError(f"env keys {keys} are not valid environment variable names")
    return v


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
        return _check_argv(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)


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
    # provisioner for more (issue 24); `never` refuses it as before.
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
        return _check_argv(v)


class Benchmark(Spec):
    type: Literal["manual", "custom"] = "manual"
    command: str | None = None
    env: dict[str, Text] = {}
    client_dedicated_node: bool = False

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

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
        return _check_name(v, "name")

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema, including the short forms the loader accepts.

    pydantic describes the validated shape; the loader also takes `restart: on-failure` and
    a single `metrics:` mapping, so editors must not flag those.
    """
    schema = Recipe.model_json_schema()

    def patch(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in list(node.items()):
                if key == "restart" and isinstance(value, dict):
                    value.setdefault("anyOf", []).append({"enum": list(RESTART_POLICIES)})
                elif key == "metrics" and isinstance(value, dict) and value.get("type") == "array":
                    node[key] = {"anyOf": [value, value["items"]], "default": []}
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
