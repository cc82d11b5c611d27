"""The recipe's `liveness:` block: is a Ready instance still healthy, or must it be restarted.

Field-level rules only (as `recipe.py`); the rules that relate it to the service (its kind,
its placement) live in `health_rules.py`. A liveness probe has the probe kinds of readiness
(`port`/`tcp`, `http`, `file`) plus `exec` (a command on the instance's node) and `log`
(hang detection: the log was not written for `silence_seconds`); a `file` probe may be a
heartbeat (`max_age_seconds`).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from srtr.resources.readiness import HttpProbe, TcpProbe
from srtr.resources.spec import Spec, Text, check_port

PROBES = ("port", "tcp", "http", "file", "exec", "log")


class TcpLiveness(TcpProbe):
    BLOCK = "liveness"


class HttpLiveness(HttpProbe):
    BLOCK = "liveness"


class ExecProbe(Spec):
    command: list[Text]

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v or any(not part for part in v):
            raise ValueError("liveness.exec.command must be a non-empty list of non-empty words")
        return v


class HeartbeatFile(Spec):
    path: str
    # None: the file must exist and not be empty, as readiness's file probe.
    max_age_seconds: float | None = Field(default=None, gt=0)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("liveness.file.path must not be empty")
        return v


class LogSilence(Spec):
    silence_seconds: float = Field(gt=0)


class Liveness(Spec):
    """Exactly one probe, plus its timing (Kubernetes' defaults: 10 s, 1 s, 3 in a row)."""

    port: int | None = None
    tcp: TcpLiveness | None = None
    http: HttpLiveness | None = None
    file: HeartbeatFile | None = None
    exec: ExecProbe | None = None
    log: LogSilence | None = None
    interval_seconds: float = Field(default=10.0, gt=0)
    timeout_seconds: float = Field(default=1.0, gt=0)
    failure_threshold: int = Field(default=3, ge=1)
    initial_delay_seconds: float = Field(default=0.0, ge=0)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        return None if v is None else check_port(v, "liveness.port")

    @model_validator(mode="after")
    def _exactly_one(self) -> Liveness:
        if self.port is not None and self.tcp is not None:
            raise ValueError("give either port (shorthand) or tcp, not both")
        given = [k for k in PROBES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "liveness needs exactly one probe: port, tcp, http, file, exec, or log; got "
                + (", ".join(given) if given else "none")
            )
        if self.log is not None and self.log.silence_seconds < self.interval_seconds:
            # A silence shorter than the interval between looks would pass unseen.
            raise ValueError(
                f"log.silence_seconds ({self.log.silence_seconds:g}) must be at least "
                f"interval_seconds ({self.interval_seconds:g})"
            )
        return self
