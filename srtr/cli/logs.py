"""`srtr logs`: an instance's log, or every instance of a service merged with node prefixes
(like `kubectl logs -l`), with `--tail`, `--since`, `--previous` and `-f`.

Logs are appended, never truncated: every attempt of an instance writes to the same file,
and the backend writes a restart marker line (`rundir.restart_marker`, with the attempt
number and its UTC start) before each attempt after the first. Those markers are the
boundaries between incarnations: `--previous` is the text between the last marker and the
one before it (or the start of the file).

Lines carry no time of their own (programs write the file directly), so `--since` gives
each line the latest time known at or before it: its own leading ISO-8601 timestamp if it
has one, else the last such line's, else its attempt's start (the marker, or the job's
start for the first attempt). The slicing is pure (`Attempt`, `attempts`, `line_times`);
`cmd_logs` does the reading and printing.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtr.cli.errors import bad

if TYPE_CHECKING:
    from srtr.store.rundir import InstanceDoc, RunState

FOLLOW_PERIOD = 0.25  # a CLI tail, not the controller: polling a file here is fine


def add_verbs(verbs: Any) -> None:
    logs = verbs.add_parser(
        "logs",
        help="print an instance's log, or every instance of a service with node prefixes",
    )
    logs.add_argument("run_dir", metavar="RUN_DIR")
    logs.add_argument(
        "name", metavar="NAME", help="an instance (service_train_node2) or a service (train)"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument(
        "--tail", type=_count, metavar="N", help="only the last N lines (of each instance)"
    )
    logs.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="only lines since a duration ago (30s, 5m, 2h, 1h30m, 1d) or a time "
        "(2026-12-02T07:00:00, local time unless it has a Z or an offset)",
    )
    logs.add_argument(
        "-p",
        "--previous",
        action="store_true",
        help="the previous attempt's output (before the last restart)",
    )
    logs.set_defaults(func=cmd_logs)


# -- arguments ------------------------------------------------------------------------------


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([smhd]))")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """`5m` → now - 300; `2026-12-02T07:00:00` → that time (local unless zoned). Wall s."""
    text = text.strip()
    if text and _DURATION.sub("", text) == "":
        return now - sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(text))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (30s, 5m, 2h, 1h30m, 1d) nor a time "
            "(2026-12-02T07:00:00)"
        ) from None
    return when.timestamp()  # naive: local time, as `date` prints it


def _since(text: str) -> float:
    try:
        return parse_since(text, time.time())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- the pure part --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One incarnation's bytes in the log: `data[start:end]` (the marker line included)."""

    number: int
    start: int
    end: int
    started_at: float | None  # wall seconds, from its marker (None for the first)


def attempts(data: bytes) -> list[Attempt]:
    """The incarnations in a log, split at the restart markers, oldest first.

    A crashed attempt may leave its last line without a newline, so a marker can end a line:
    the cut is where the marker begins, not where its line does.
    """
    out: list[Attempt] = []
    start, number, started = 0, 0, None
    for match in _marker_bytes().finditer(data):
        out.append(Attempt(number, start, match.start(), started))
        stamp = match.group(4).decode("ascii", "replace")
        try:
            when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            started = when.timestamp()
        except ValueError:
            started = None
        start, number = match.start(), int(match.group(2))
    out.append(Attempt(number, start, len(data), started))
    return out


@functools.cache
def _marker_bytes() -> re.Pattern[bytes]:
    """The marker, searched for in bytes: offsets are byte offsets, and a log need not be
    UTF-8. Compiled on first use: every verb imports this module to build its parser."""
    from srtr.store.rundir import RESTART_MARKER

    return re.compile(RESTART_MARKER.pattern.encode(), re.M)


_STAMP = re.compile(
    r"^\[?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
)


def _stamp(line: str) -> float | None:
    match = _STAMP.match(line)
    if match is None:
        return None
    try:
        return datetime.fromisoformat(match.group(1).replace(",", ".")).timestamp()
    except ValueError:
        return None


def line_times(lines: Sequence[str], start: float | None) -> list[float | None]:
    """The time of each line: its own timestamp, else the last one before it, else `start`."""
    out: list[float | None] = []
    known = start
    for line in lines:
        own = _stamp(line)
        if own is not None:
            known = own
        out.append(known)
    return out


def select(
    data: bytes,
    *,
    previous: bool = False,
    tail: int | None = None,
    since: float | None = None,
    first_start: float | None = None,
) -> bytes | None:
    """The part of a log `srtr logs` prints; None when `previous` asks for an attempt that
    the log does not have. `first_start` is when the first attempt began (the job's start)."""
    found = attempts(data)
    if previous:
        if len(found) < 2:
            return None
        chosen = [found[-2]]
    else:
        chosen = found
    if since is None and tail is None:
        return b"".join(data[a.start : a.end] for a in chosen)
    lines: list[str] = []
    times: list[float | None] = []
    for a in chosen:
        part = data[a.start : a.end].decode("utf-8", "replace").splitlines(keepends=True)
        lines += part
        times += line_times(part, a.started_at if a.started_at is not None else first_start)
    if since is not None:
        kept = [(t, line) for t, line in zip(times, lines, strict=True)]
        lines = [line for t, line in kept if t is not None and t >= since]
    if tail is not None:
        lines = lines[-tail:] if tail else []
    return "".join(lines).encode("utf-8")


# -- the verb -------------------------------------------------------------------------------


def resolve(state: RunState, name: str, run_dir: Path) -> list[InstanceDoc]:
    """The instances NAME means: one instance, or every instance of a service."""
    instances = state.instances
    exact = [i for i in instances if i["name"] == name]
    if exact:
        return exact
    service = [i for i in instances if i["service"] == name]
    if service:
        return service
    known = sorted({i["name"] for i in instances} | {i["service"] for i in instances})
    import difflib  # only for a name that matches nothing

    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    services = sorted({i["service"] for i in instances})
    raise bad(
        str(run_dir),
        f"no instance or service {name!r}{hint}; services: {', '.join(services)}; "
        f"instances: {', '.join(sorted(i['name'] for i in instances))}",
    )


def _prefixes(chosen: list[InstanceDoc]) -> dict[str, str]:
    if len(chosen) == 1:
        return {chosen[0]["name"]: ""}
    nodes = [i["node"] for i in chosen]
    by_node = len(set(nodes)) == len(nodes)
    return {i["name"]: f"[{i['node'] if by_node else i['name']}] " for i in chosen}


def cmd_logs(args: argparse.Namespace) -> int:
    from srtr.cli.run_state import read_run

    run_dir = Path(args.run_dir)
    state = read_run(run_dir)
    if args.previous and args.follow:
        raise bad("--previous", "the previous attempt has ended: it cannot be followed (drop -f)")
    chosen = resolve(state, args.name, run_dir)
    prefixes = _prefixes(chosen)
    out = sys.stdout.buffer
    first_start = state.job.get("started_at")
    offsets: dict[str, int] = {}
    missing_previous = []
    for inst in chosen:
        path = run_dir / inst["log"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            print(f"{path}: no output yet", file=sys.stderr)
            data = b""
        offsets[inst["name"]] = len(data)
        part = select(
            data,
            previous=args.previous,
            tail=args.tail,
            since=args.since,
            first_start=first_start,
        )
        if part is None:
            missing_previous.append(inst["name"])
            continue
        _write(out, part, prefixes[inst["name"]])
    out.flush()
    if missing_previous and len(missing_previous) == len(chosen):
        names = ", ".join(missing_previous)
        raise bad(str(run_dir), f"no previous attempt of {names}: it has not restarted")
    if not args.follow:
        return 0
    return _follow(run_dir, chosen, prefixes, offsets)


def _write(out: Any, data: bytes, prefix: str) -> None:
    if not data:
        return
    if not prefix:
        out.write(data)
        return
    head = prefix.encode()
    lines = data.splitlines(keepends=True)
    out.write(b"".join(head + (line if line.endswith(b"\n") else line + b"\n") for line in lines))


def _follow(
    run_dir: Path, chosen: list[InstanceDoc], prefixes: dict[str, str], offsets: dict[str, int]
) -> int:
    """Print what each log gains until the job ends; with prefixes only whole lines (a
    partial line waits for its end, so two instances' lines never mix)."""

    out = sys.stdout.buffer
    pending: dict[str, bytes] = {i["name"]: b"" for i in chosen}
    try:
        while True:
            for inst in chosen:
                name = inst["name"]
                path = run_dir / inst["log"]
                try:
                    with path.open("rb") as handle:
                        handle.seek(offsets[name])
                        chunk = handle.read()
                except FileNotFoundError:
                    continue
                offsets[name] += len(chunk)
                if not prefixes[name]:
                    out.write(chunk)
                    continue
                data = pending[name] + chunk
                whole, _, rest = data.rpartition(b"\n")
                pending[name] = rest
                if whole or data.startswith(b"\n"):
                    _write(out, whole + b"\n", prefixes[name])
            out.flush()
            if not _runs(run_dir):
                for name, rest in pending.items():
                    if rest:
                        _write(out, rest, prefixes[name])
                out.flush()
                return 0
            time.sleep(FOLLOW_PERIOD)
    except KeyboardInterrupt:
        return 0


def _runs(run_dir: Path) -> bool:
    """The job's controller still beats (heartbeat, from any host): -f goes on."""
    from srtr.cli.run_state import check_liveness, read_run

    state = read_run(run_dir)
    return not state.ended and check_liveness(run_dir, state, slurm=False).running
