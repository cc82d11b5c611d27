"""The messages between the controller and its node agents, their encoding and the proofs.

Pure: no sockets, no processes, no clock. One message is one line of JSON (`encode`,
`decode`), `{"type": ..., field: value, ...}`; unknown types and malformed lines raise
`ProtocolError`, and the reader drops that connection.

A connection starts with a mutual proof of the job's token (`SRTR_AGENT_TOKEN`, in the
agent's environment, never in argv):

1. controller → agent: `Challenge(nonce)`;
2. agent → controller: `Hello(node, pid, nonce', proof = HMAC(token, "agent", nonce, node))`;
3. controller → agent: `Welcome(proof = HMAC(token, "controller", nonce', node))`, or it
   closes the connection.

So the token itself never crosses the wire, a process that does not hold it cannot pose as
an agent (and learn instance specs) nor as the controller (and start processes), and a proof
cannot be replayed on another connection (fresh nonces). `srtr up` runs all of it inside
TLS with a pinned job certificate (`channel`), heartbeats included.

Controller → agent: `Launch`, `Signal`, `Probe`, `Watch`, `Shutdown`. Agent → controller:
`Launched` / `LaunchFailed` (the answer to a `Launch`, same `seq`), `Exited`, `ProbeResult`
(same `seq` as its `Probe`), `Health` (a `Watch`'s transitions), `Bye` (after a `Shutdown`,
when every instance of the node has been reaped and reported).

Relays (a fan-in of heartbeats for large jobs: `relay`, `relayed`, docs/agents.md "Relays"):
controller → agent `Relay` (be your group's relay) and `RelayTo` (tell your group's relay you
are alive); agent → controller `Relaying` (the relay's UDP port) and `Relayed` (once a
second: the members it did not hear).

Heartbeats are not messages: a frame between the stream's records every heartbeat period,
on the same connection, tagged with the `Welcome`'s `beat_key` (`frames`; the controller
holds one descriptor per agent and never wakes for a heartbeat: `channel`, "Heartbeats").
Its arrival is all it says, and TCP's acknowledgement of it is the agent's lease (`node`,
"The lease"). `BEAT`, an empty line in the stream, is the same heartbeat where the agent
cannot write frames.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson

from srtr.backends.base import LaunchSpec
from srtr.resources.objects import ProbeKind, ProbeSpec

VERSION = 4  # 4: relays (a fan-in of heartbeats, `relay`); 3: heartbeats as tagged frames
# The longest line either side reads: a launch with a large environment fits.
MAX_LINE = 16 * 1024 * 1024
TOKEN_ENV = "SRTR_AGENT_TOKEN"
BEAT = b"\n"  # one heartbeat as a line of the stream (`frames.beat` is the usual one)
DEFAULT_GRACE = 30.0  # a Launch without a grace (an older controller): the recipe's default


class ProtocolError(Exception):
    """A line that is not a message of this protocol."""


@dataclass(frozen=True)
class Challenge:
    TYPE: ClassVar[str] = "challenge"
    nonce: str
    version: int = VERSION


@dataclass(frozen=True)
class Hello:
    """`live`: [name, attempt, pid, start] of every attempt the agent runs: none on its first
    connection, those it kept through a controller crash on a later one (adoption)."""

    TYPE: ClassVar[str] = "hello"
    node: str
    pid: int
    nonce: str
    proof: str
    version: int = VERSION
    live: list[list[Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Welcome:
    """`lease`: seconds the agent may go with no heartbeat acknowledged before it fences
    itself (stops its instances); 0: no lease. `heartbeat`: how often it sends one;
    `beat_key`: the session's key of their tags (hex; `frames.beat_tag`)."""

    TYPE: ClassVar[str] = "welcome"
    proof: str
    heartbeat: float
    lease: float = 0.0
    beat_key: str = ""


@dataclass(frozen=True)
class Launch:
    TYPE: ClassVar[str] = "launch"
    seq: int
    spec: LaunchSpec


@dataclass(frozen=True)
class Launched:
    TYPE: ClassVar[str] = "launched"
    seq: int
    name: str
    attempt: int
    pid: int
    start: int | None  # the leader's kernel start time (clock ticks since boot)


@dataclass(frozen=True)
class LaunchFailed:
    TYPE: ClassVar[str] = "launch_failed"
    seq: int
    name: str
    attempt: int
    message: str


@dataclass(frozen=True)
class Signal:
    """`signum` to `name`'s live attempt; only if it is attempt `attempt`, when given."""

    TYPE: ClassVar[str] = "signal"
    name: str
    signum: int
    attempt: int | None = None


@dataclass(frozen=True)
class Exited:
    TYPE: ClassVar[str] = "exited"
    name: str
    attempt: int
    pid: int
    exit_code: int | None
    signal: int | None
    message: str
    reason: str = ""  # OOMKilled: the node saw the OOM killer end it


@dataclass(frozen=True)
class Probe:
    """One readiness probe attempt of `name`'s attempt `attempt`, run on the node."""

    TYPE: ClassVar[str] = "probe"
    seq: int
    name: str
    attempt: int
    probe: ProbeSpec
    node_ip: str
    log_path: str
    log_offset: int
    files_dir: str  # relative file probe paths resolve against this (the run's logs/)
    # A liveness attempt (its timeout bounds it); `env`: an exec probe's environment.
    env: dict[str, str] = field(default_factory=dict)
    liveness: bool = False


@dataclass(frozen=True)
class ProbeResult:
    TYPE: ClassVar[str] = "probe_result"
    seq: int
    ok: bool
    message: str


@dataclass(frozen=True)
class Watch:
    """Probe `name`'s attempt `attempt` on the node every interval, from `delay` seconds on,
    and report only its transitions (`Health`): `kind` is `liveness`, or `readiness` after
    its gate. A new `Watch` of the same name and kind replaces the old one; the instance's
    exit or next launch ends it."""

    TYPE: ClassVar[str] = "watch"
    name: str
    attempt: int
    kind: str
    probe: ProbeSpec
    node_ip: str
    log_path: str
    log_offset: int
    files_dir: str
    delay: float
    env: dict[str, str] = field(default_factory=dict)  # an exec probe's


@dataclass(frozen=True)
class Health:
    """A watched probe changed: failing (`ok` false, after `failures` in a row, the probe's
    `failure_threshold`) or passing again."""

    TYPE: ClassVar[str] = "health"
    name: str
    attempt: int
    kind: str
    ok: bool
    failures: int
    message: str


@dataclass(frozen=True)
class Shutdown:
    """SIGKILL every instance of the node, report their exits, answer `Bye`, exit."""

    TYPE: ClassVar[str] = "shutdown"
    reason: str = ""


@dataclass(frozen=True)
class Bye:
    TYPE: ClassVar[str] = "bye"


@dataclass(frozen=True)
class Relay:
    """Relay the liveness of the `count` members of your group (indexes 0..count-1; yours is
    `index`), whose datagrams carry tags under `key` (hex); `count` 0: stop relaying."""

    TYPE: ClassVar[str] = "relay"
    key: str
    count: int
    index: int = 0


@dataclass(frozen=True)
class Relaying:
    """A relay's answer to `Relay`: the UDP port it listens on (0: it could not bind one)."""

    TYPE: ClassVar[str] = "relaying"
    port: int
    error: str = ""


@dataclass(frozen=True)
class RelayTo:
    """Send your group's relay at host:port a datagram a second, as member `index`, tagged
    under `key` (hex), while your lease holds; `port` 0: stop."""

    TYPE: ClassVar[str] = "relay_to"
    host: str
    port: int
    key: str = ""
    index: int = 0


@dataclass(frozen=True)
class Relayed:
    """A relay's record, once a second: the members (indexes) it did not hear lately."""

    TYPE: ClassVar[str] = "relayed"
    missing: list[int] = field(default_factory=list)


Message = (
    Challenge
    | Hello
    | Welcome
    | Launch
    | Launched
    | LaunchFailed
    | Signal
    | Exited
    | Probe
    | ProbeResult
    | Watch
    | Health
    | Shutdown
    | Bye
    | Relay
    | Relaying
    | RelayTo
    | Relayed
)
_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (
        Challenge,
        Hello,
        Welcome,
        Launch,
        Launched,
        LaunchFailed,
        Signal,
        Exited,
        Probe,
        ProbeResult,
        Watch,
        Health,
        Shutdown,
        Bye,
        Relay,
        Relaying,
        RelayTo,
        Relayed,
    )
}


def encode(message: Message) -> bytes:
    """One line of JSON, newline included (orjson: a stage sends one per launch, and the
    stdlib's encoder was most of a launch's encoding)."""
    doc: dict[str, Any] = {"type": message.TYPE}
    for name in _names(type(message)):
        doc[name] = _plain(getattr(message, name))
    return orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    """A message class's field names (`dataclasses.fields` is slow for one per launch)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(item.name for item in dataclasses.fields(cls))
    return names


def decode(line: bytes) -> Message:
    """The message of one line; raises ProtocolError when it is not one."""
    try:
        doc = orjson.loads(line)
        cls = _TYPES[doc.pop("type")]
        if cls is Launch:
            doc["spec"] = spec_from_json(doc["spec"])
        elif cls is Probe or cls is Watch:
            doc["probe"] = _probe_from_json(doc["probe"])
        message: Message = cls(**doc)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ProtocolError(f"not a message: {line[:200]!r}: {exc!r}") from None
    return message


def proof(token: str, role: str, nonce: str, node: str) -> str:
    """HMAC-SHA256 of (role, nonce, node) under the job's token, hex."""
    text = f"srtr-agent/{VERSION}\n{role}\n{nonce}\n{node}".encode()
    return hmac.new(token.encode(), text, hashlib.sha256).hexdigest()


def verify(token: str, role: str, nonce: str, node: str, given: str) -> bool:
    """True when `given` is `proof(token, role, nonce, node)`; constant time."""
    return hmac.compare_digest(proof(token, role, nonce, node), given)


def spec_to_json(spec: LaunchSpec) -> dict[str, Any]:
    """What the agent needs of a LaunchSpec (srun-only fields stay behind)."""
    return {
        "name": spec.name,
        "node": spec.node,
        "node_ip": spec.node_ip,
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "log_path": str(spec.log_path),
        "attempt": spec.attempt,
        "preamble": spec.preamble,
        "shell": spec.shell,
        "cwd": None if spec.cwd is None else str(spec.cwd),
        "stop_grace_seconds": spec.stop_grace_seconds,
        "memory_limit": spec.memory_limit,
    }


def spec_from_json(doc: dict[str, Any]) -> LaunchSpec:
    env = doc["env"]
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TypeError("env must map names to strings")
    return LaunchSpec(
        name=str(doc["name"]),
        node=str(doc["node"]),
        node_ip=str(doc["node_ip"]),
        argv=tuple(str(a) for a in doc["argv"]),
        env=env,
        log_path=Path(doc["log_path"]),
        attempt=int(doc["attempt"]),
        preamble=doc["preamble"],
        shell=bool(doc["shell"]),
        cwd=None if doc["cwd"] is None else Path(doc["cwd"]),
        stop_grace_seconds=float(doc.get("stop_grace_seconds", DEFAULT_GRACE)),
        memory_limit=_optional_int(doc.get("memory_limit")),
    )


def _optional_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("memory_limit must be a whole number of bytes")
    return value


def _probe_from_json(doc: dict[str, Any]) -> ProbeSpec:
    # JSON has lists; the spec is frozen and hashable
    more, command = tuple(doc.get("more_ports", ())), tuple(doc.get("command", ()))
    return ProbeSpec(
        **{**doc, "kind": ProbeKind(doc["kind"]), "more_ports": more, "command": command}
    )


def _plain(value: Any) -> Any:
    if isinstance(value, LaunchSpec):
        return spec_to_json(value)
    if isinstance(value, ProbeSpec):
        return {name: getattr(value, name) for name in _names(ProbeSpec)}
    return value


__all__ = [
    "BEAT",
    "MAX_LINE",
    "TOKEN_ENV",
    "VERSION",
    "Bye",
    "Challenge",
    "Exited",
    "Health",
    "Hello",
    "Launch",
    "LaunchFailed",
    "Launched",
    "Message",
    "Probe",
    "ProbeResult",
    "ProtocolError",
    "Relay",
    "RelayTo",
    "Relayed",
    "Relaying",
    "Shutdown",
    "Signal",
    "Watch",
    "Welcome",
    "decode",
    "encode",
    "proof",
    "spec_from_json",
    "spec_to_json",
    "verify",
]
