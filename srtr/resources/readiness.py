"""`readiness:`: the probe that says an instance is up (tcp, http, log or file), and its timing.

A recipe writes it per service or role; a kind brings a default one (`kinds/base.py`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from srtr.resources.spec import Spec, check_port


class TcpProbe(Spec):
    # The block the probe is in, for its messages: liveness's probe is this one (`liveness.py`).
    BLOCK: ClassVar[str] = "readiness"
    port: int

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return check_port(v, f"{cls.BLOCK}.tcp.port")


class HttpProbe(Spec):
    BLOCK: ClassVar[str] = "readiness"
    port: int
    path: str = "/health"
    status: int = 200

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return check_port(v, f"{cls.BLOCK}.http.port")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"{cls.BLOCK}.http.path must start with '/'")
        return v

    @field_validator("status")
    @classmethod
    def _status(cls, v: int) -> int:
        if not 100 <= v <= 599:
            raise ValueError(f"{cls.BLOCK}.http.status must be an HTTP status code; got {v}")
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
    # After the gate: this many failed attempts in a row make a Ready instance NotReady.
    failure_threshold: int = Field(default=3, ge=1)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        return None if v is None else check_port(v, "readiness.port")

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
