"""The run dir's contract: the model of state.json and events.jsonl, and their one reader.

docs/cli.md ("The run dir") says what a run dir holds; this module says it in types, once:

- `StateDoc` (with `JobDoc`, `NodeDoc`, `PoolDoc`, `InstanceDoc`, `ExporterDoc`) is
  state.json and `EventDoc` one line of events.jsonl. The writer is
  `srtr.store.persist` (`snapshot`, `EventLog`), which `srtr.runtime.lifecycle`
  drives; it builds these types, so mypy checks it against the same field list as the
  readers.
- `read_state` is the one reader of state.json (for a big job the snapshot with its delta
  log applied, `state_delta`) and `parse_event` of an events.jsonl line; `read_summary`
  reads a big job's summary.json and `state_version` says whether the state changed.
  Their users: the CLI (`up` on a used run dir and `--adopt`, `status`, `logs`, `tui`,
  `down`, `plan --against`), the job's guard, its control client and adoption
  (`srtr.runtime`), and the TUI (`srtr.tui.source`, `srtr.tui.launch`).
- `restart_marker` is the line the local backend writes into an instance's log before a
  restart; `parse_restart_marker` is how the TUI finds it again.
- `read_heartbeat` reads the controller's heartbeat (`heartbeat.json`, refreshed every
  `HEARTBEAT_PERIOD`): whether a controller runs is decided from its age (with the SLURM
  job's state, in `srtr.runtime.liveness`), never from a pid, which means nothing on another
  host. `pid_alive` is left for the controller's own host (the guard, adoption).
- `ready_now` answers "is this instance ready now?" (its `ready` outlives the attempt).

The documents are TypedDicts, i.e. the plain dicts `json` reads and writes: state.json is
rewritten up to five times a second with 4,096 instance records, the TUI's view-model reads
them as mappings, and `srtr status -o json` prints the document exactly as written. Typing
what is already there costs nothing at run time and changes no field, order or value.
Field order in the classes is the order in the file.

Reading is tolerant: `read_state` only insists on a JSON object with a `job` object, and
raises `StateFileError` (missing, torn or foreign file) for each caller to handle as it
always has (the CLI exits 2, the guard and the control client give up quietly, the TUI
shows a warning and keeps the last snapshot). Fields are read with defaults where an older
or a crashed writer may have left them out.

Imports: the reconciler's status types only; never controllers, backends or the TUI.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

import orjson

from srtr.store.state_delta import DELTA_FILE, SUMMARY_FILE, apply_deltas, snapshot_seq
from srtr.store.status import JOB_ENDED, ExitRecord, Phase

STATE_FILE = "state.json"
EVENTS_FILE = "events.jsonl"

# -- the model ------------------------------------------------------------------------------


class ConditionDoc(TypedDict):
    """A Kubernetes-style condition of the job or of an instance."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition: float


class JobDoc(TypedDict):
    """state.json `job`: the job's status, and where its controller runs."""

    name: str
    backend: str  # local | slurm | fake
    phase: str  # a JobPhase
    exit_code: int | None
    reason: str
    generation: int
    observed_generation: int
    controller_pid: int
    slurm_job_id: str | None
    stage: int
    passed_stages: list[str]
    started_at: float | None  # wall seconds
    end_time: float | None  # when the SLURM allocation ends (wall seconds), once known
    ended_at: float | None
    stages: list[str]
    conditions: list[ConditionDoc]
    write_faults: list[WriteFaultDoc]  # files srtr cannot write now (absent from older run dirs)
    cause: CauseDoc | None  # the first failure (`store/causes.py`)
    # Added by the runner (`srtr.runtime.lifecycle`) on top of the store's snapshot:
    control: NotRequired[str]  # the control socket's path (a same-host fast path; may be absent)
    control_addresses: NotRequired[list[str]]  # HOST:PORT of the control channel (TLS)
    controller_host: NotRequired[str]  # the host name the controller runs on
    recipe_path: NotRequired[str | None]  # the recipe file being watched for live edits
    owns_allocation: NotRequired[bool]  # srtr made the SLURM allocation (and releases it)
    metrics_url: NotRequired[str | None]
    launcher: NotRequired[str]  # process | step | agent: how instances are started
    # A local job's loopback block, 127.B.0.0/16 (backends/local/loopback.py).
    network: NotRequired[str]
    # Services with depends_on not started yet: what each waits for ("scheduler ready").
    waiting: NotRequired[dict[str, str]]


class CauseDoc(TypedDict):
    """state.json `job.cause`: the job's first failure (None until one happened); written
    by `causes.cause_doc`."""

    instance: str
    node: str
    attempt: int
    at: float  # wall seconds
    reason: str  # OOMKilled | LivenessFailed | NodeLost | LaunchFailed | Error
    exit_code: int | None
    signal: int | None
    signal_name: str | None  # SIGKILL, ... when a signal ended it
    message: str
    log: str  # relative to the run dir
    log_offset: int  # where that attempt's output starts in the log
    summary: str  # the one line srtr prints for it


class WriteFaultDoc(TypedDict):
    """A file of the run dir (or stdout) that srtr cannot write now (`write_faults.py`)."""

    file: str  # relative to the run dir: state.json, events.jsonl, logs/srtr.log, ...; stdout
    errno: str  # ENOSPC, EROFS, EFBIG, ENOENT, ...
    error: str  # "ENOSPC: No space left on device"
    since: float  # wall seconds of the first failed write
    failures: int  # failed writes since


class NodeDoc(TypedDict):
    name: str
    ip: str
    state: str  # the node's role: worker | pool:<name> | dedicated | spare


class PoolDoc(TypedDict):
    name: str
    type: str
    nodes: list[str]
    riders: list[str]
    ready: bool
    # Waiting for nodes a grow request asked for: the provider's word (docs/recipe.md).
    pending: str | None
    # An autoscaled pool: min, max, size, desired (last published), source, error.
    autoscale: NotRequired[dict[str, Any]]
    # A pool that restarts as a whole (`restart.scope: pool`), once it first failed: its
    # pool restarts, whether it is Failed, and its latest failure.
    restarts: NotRequired[int]
    failed: NotRequired[bool]
    first_failure: NotRequired[str]


class InstanceDoc(TypedDict):
    """One instance: its spec (placement, command) and its observed status."""

    name: str
    service: str
    kind: str  # an InstanceKind: owner | rider | service | worker | frontend | benchmark
    pool: str | None
    index: int
    node: str
    node_ip: str
    phase: str  # a Phase
    ready: bool  # the current attempt passed readiness (alive or not)
    restarts: int
    exit_code: int | None
    pid: int | None
    step: str | None  # the SLURM step
    log: str  # relative to the run dir
    shutdown_tier: int
    critical: bool
    terminal: bool
    command: list[str]
    env: dict[str, str]  # secret-looking values masked
    probe: str | None  # the probe, described
    probe_message: str  # why the probe fails now ('' when it passes or has not run)
    # When a probe not passed yet runs out of time (None: passed, no probe, not probing);
    # probe_gate: that is the stage gate's deadline (missing it fails the job).
    probe_deadline: NotRequired[float | None]
    probe_gate: NotRequired[bool]
    started_at: float | None  # wall seconds, as every time below
    ready_at: float | None
    stop_grace_seconds: float
    stop_deadline: float | None  # SIGKILL time of an instance being stopped
    next_start_at: float | None  # in BackOff: the next launch
    # the last 20 exits: attempt, exit_code, signal, at, message; `planned` (why) when it
    # was stopped for a planned restart (a user's, a rollout's); `reason` (OOMKilled,
    # Error, ...) when it was a failure srtr did not cause. The instance's first failure
    # stays first, however many exits followed.
    history: list[ExitRecord]
    attempt: int
    activated: bool
    identity: dict[str, int] | None  # pid and kernel start time: what adoption checks
    log_offset: int  # where the current attempt's output starts in the log
    conditions: list[ConditionDoc]
    # Its liveness probe, described (None: none), and why it fails now ('' when it passes).
    liveness: str | None
    liveness_message: str


class ExporterDoc(TypedDict):
    """A Prometheus scrape target; the exporter controller adds its listing and health."""

    service: str
    node: str
    instance: str
    url: str
    name: NotRequired[str]
    listed: NotRequired[bool]
    up: NotRequired[bool | None]
    last_error: NotRequired[str | None]
    last_scrape: NotRequired[float | None]


class StateDoc(TypedDict):
    """state.json, rewritten whole (atomically) whenever the store changes; for a big job
    the document a snapshot and its delta log make (`state_log`)."""

    job: JobDoc
    nodes: list[NodeDoc]
    pools: list[PoolDoc]
    instances: list[InstanceDoc]
    # Live edits: the pending plan, the last rejection or application, and `discarded` (the
    # file differs from what runs: its plan was discarded).
    recipe: dict[str, Any]
    carve: dict[str, Any]  # which nodes went where (`NodeMap.to_json`), for adoption
    exporters: list[ExporterDoc]


class EventDoc(TypedDict):
    """One line of events.jsonl."""

    ts: float  # wall seconds
    type: str  # an EventType: Normal | Warning
    reason: str  # CamelCase: Launched, Ready, Exited, BackOff, ...
    object: str  # job | pool/<name> | instance/<name>
    message: str
    generation: int


GUARD_FILE = "guard.json"


class GuardDoc(TypedDict):
    """guard.json: what the job's guard saw of its controller's death, and what it did.

    Written (atomically) by `srtr.runtime.guard` once the controller it watches is gone
    without ending the job, and again if it kills what nobody adopted. A successor's guard
    never rewrites it for the old controller; readers match `controller_pid` to state.json's.
    """

    controller_pid: int
    lost_at: float  # wall seconds: the guard saw the controller die
    adopt_until: float  # wall seconds: `srtr up --adopt` may take the job over until then
    killed_at: float | None  # wall seconds: it killed the instances nobody adopted
    killed: int  # instance process groups it killed then


# -- reading --------------------------------------------------------------------------------


class StateFileError(Exception):
    """state.json cannot be read as an srtr state file. `str()` is the problem alone.

    `missing`: there is no such file. `foreign`: it is JSON, but not an srtr state file.
    Otherwise it could not be read or parsed (torn, unreadable, not JSON).
    """

    def __init__(
        self, path: Path, problem: str, *, missing: bool = False, foreign: bool = False
    ) -> None:
        super().__init__(problem)
        self.path = path
        self.missing = missing
        self.foreign = foreign


@dataclass(frozen=True, slots=True)
class RunState:
    """One reading of state.json: the document as written, and what readers decide on."""

    doc: StateDoc
    # A big job's: the last change of the delta log applied (None: a whole state.json).
    seq: int | None = None

    @classmethod
    def from_doc(
        cls, doc: object, path: Path = Path(STATE_FILE), seq: int | None = None
    ) -> RunState:
        """Wrap a parsed state.json. Raises StateFileError(foreign) unless it has a `job`."""
        if not isinstance(doc, dict) or not isinstance(doc.get("job"), dict):
            raise StateFileError(path, "not an srtr state file", foreign=True)
        return cls(cast(StateDoc, doc), seq)

    @property
    def job(self) -> JobDoc:
        return self.doc["job"]

    @property
    def phase(self) -> str:
        return str(self.job.get("phase", ""))

    @property
    def ended(self) -> bool:
        """The job reached Succeeded or Failed: nothing of it runs any more."""
        return self.job.get("phase") in JOB_ENDED

    @property
    def controller_pid(self) -> int | None:
        pid = self.job.get("controller_pid")
        return pid if isinstance(pid, int) else None

    @property
    def nodes(self) -> list[NodeDoc]:
        return self.doc.get("nodes") or []

    @property
    def instances(self) -> list[InstanceDoc]:
        return self.doc.get("instances") or []

    @property
    def pools(self) -> list[PoolDoc]:
        return self.doc.get("pools") or []

    @property
    def exporters(self) -> list[ExporterDoc]:
        return self.doc.get("exporters") or []

    @property
    def write_faults(self) -> list[WriteFaultDoc]:
        return self.job.get("write_faults") or []


def read_state(run_dir: Path) -> RunState:
    """Read `run_dir`'s state.json, and for a big job the delta log after it.

    Args:
        run_dir: the run dir (its state.json is read).

    Returns:
        The snapshot, as written.

    Raises:
        StateFileError: the file is missing (`missing`), cannot be read or parsed, or is
            not an srtr state file (`foreign`). Its text is the underlying error's.
    """
    path = run_dir / STATE_FILE
    try:
        with collector_paused():
            doc = orjson.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise StateFileError(path, str(exc), missing=True) from None
    except (OSError, ValueError) as exc:
        raise StateFileError(path, str(exc)) from None
    state = RunState.from_doc(doc, path)
    seq = snapshot_seq(doc)
    if seq is None:
        return state
    # a snapshot: the changes since are in the delta log
    return RunState(state.doc, apply_deltas(doc, seq, read_lines(run_dir / DELTA_FILE)))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a document of millions of objects is built: each
    pass would walk all those built so far, for nothing (a parsed document has no cycles),
    and the passes doubled a big job's parse."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# The files whose change is a change of the state (a big job's writes append to the log).
STATE_FILES = (STATE_FILE, DELTA_FILE)
Stamp = tuple[int, int, int] | None


def state_version(run_dir: Path) -> tuple[Stamp, ...]:
    """What differs whenever the state changed: inode, mtime and size of state.json (which
    is replaced by rename: a new inode) and of a big job's delta log."""
    stamps: list[Stamp] = []
    for name in STATE_FILES:
        try:
            st = (run_dir / name).stat()
        except OSError:
            stamps.append(None)
            continue
        stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stamps)


def read_lines(path: Path) -> list[bytes]:
    """The lines of `path` (none when it is missing or unreadable)."""
    try:
        return path.read_bytes().splitlines()
    except OSError:
        return []


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """A big job's summary.json (`state_summary`): the job, its pools and its counts, which
    `srtr status` prints without reading every instance. None for a job small enough to
    have none (state.json is whole then), or when it cannot be read."""
    try:
        doc = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("job"), dict) else None


class HeartbeatDoc(TypedDict):
    """heartbeat.json: the controller's heartbeat, rewritten (atomically) every `period`."""

    ts: float  # wall seconds of the last beat
    period: float
    host: str  # the controller's host name
    machine: (
        str  # boot id and pid namespace: `same_machine` tells whether its pid means anything here
    )
    pid: int
    stopped: bool  # its last beat: the controller has ended (cleanly)


HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_PERIOD = 1.0
# Missed beats (or a controller stuck this long) before readers call the controller gone. Wall
# clocks of the hosts are compared: they must agree within a second or two (NTP does).
HEARTBEAT_STALE = 5.0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One reading of heartbeat.json."""

    doc: HeartbeatDoc

    def age(self, now: float) -> float:
        """Seconds since the last beat, by this host's wall clock (0 for a clock ahead)."""
        return max(0.0, now - float(self.doc.get("ts") or 0.0))

    def fresh(self, now: float) -> bool:
        """The controller beat recently and has not said it stopped: it runs."""
        if self.doc.get("stopped"):
            return False
        period = float(self.doc.get("period") or HEARTBEAT_PERIOD)
        return self.age(now) <= max(HEARTBEAT_STALE, 5 * period)

    @property
    def host(self) -> str:
        return str(self.doc.get("host") or "?")

    @property
    def pid(self) -> int | None:
        pid = self.doc.get("pid")
        return pid if isinstance(pid, int) else None

    def same_machine(self) -> bool:
        """The controller runs in this kernel and pid namespace: its pid is one of ours."""
        return bool(self.doc.get("machine")) and self.doc.get("machine") == machine_id()


def read_heartbeat(run_dir: Path) -> Heartbeat | None:
    """`run_dir`'s heartbeat.json; None when there is none (no controller ever beat there,
    or one older than heartbeats) or it cannot be read."""
    try:
        doc = json.loads((run_dir / HEARTBEAT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Heartbeat(cast(HeartbeatDoc, doc)) if isinstance(doc, dict) else None


def machine_id() -> str:
    """This kernel (boot id) and pid namespace: two processes with the same id see each
    other's pids. Host names do not say that (a container, a node's pid namespace)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{pidns}"


def read_guard(run_dir: Path, controller_pid: int | None) -> GuardDoc | None:
    """The guard's record of controller `controller_pid`'s death, if it wrote one."""
    try:
        doc = json.loads((run_dir / GUARD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("controller_pid") != controller_pid:
        return None  # another controller's (an adopted one's), or not ours at all
    return cast(GuardDoc, doc)


def ready_now(instance: Mapping[str, Any]) -> bool:
    """The instance is ready now: its attempt passed readiness (`ready`, which stays true
    once the attempt ended) and it is still Ready or Running."""
    return bool(instance.get("ready")) and instance.get("phase") in (Phase.READY, Phase.RUNNING)


def parse_event(line: str) -> EventDoc | None:
    """One events.jsonl line as an event; None for what is not a whole event (a writer
    killed mid-line leaves a torn last line)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return cast(EventDoc, event) if isinstance(event, dict) else None


def pid_alive(pid: object) -> bool:
    """Whether process `pid` exists (also when it belongs to another user). False for
    anything that is not a positive pid, such as a missing `controller_pid`."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the restart marker in instance logs ----------------------------------------------------

# A crashed attempt may leave its last line without a newline, so the marker can end a
# line rather than start one: readers search for it anywhere on a line (`re.M`).
RESTART_MARKER = re.compile(
    r"==== srtr: (\S+) attempt (\d+) starting on (\S+) at (\S+) ====\r?$", re.M
)
MARKER_PREFIX = b"==== srtr: "  # what a byte-level search looks for first


@dataclass(frozen=True, slots=True)
class RestartMarker:
    instance: str
    attempt: int
    node: str
    at: str  # UTC, ISO 8601 with microseconds and a Z


def restart_marker(*, instance: str, attempt: int, node: str, at: datetime) -> str:
    """The line (with its newline) written to `instance`'s log before attempt `attempt`
    starts on `node`; `at` is an aware UTC time."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"==== srtr: {instance} attempt {attempt} starting on {node} at {stamp} ====\n"


def parse_restart_marker(text: str) -> RestartMarker | None:
    """The marker that `text` (a line, or the rest of one) is exactly, or None."""
    match = RESTART_MARKER.fullmatch(text.rstrip("\n"))
    if match is None:
        return None
    instance, attempt, node, at = match.groups()
    return RestartMarker(instance, int(attempt), node, at)
