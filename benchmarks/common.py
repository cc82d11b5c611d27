"""Shared pieces of the benchmark harness: figures, srtr jobs, /proc sampling, metrics.

Nothing here is imported by srtr. Every scenario module exposes
`run(ctx: Context) -> list[Figure]`; `benchmarks.run` calls them and prints the table.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class Skip(Exception):
    """A scenario that cannot run here (no SLURM, ...). `benchmarks.run` records the reason
    and exits non-zero: a skipped scenario is a missing number, not a pass."""


# --- figures ------------------------------------------------------------------------------------


@dataclass
class Figure:
    """One row of the results table.

    `value` is what srtr measured, `baseline` the same measure of the baseline system in the
    same run; `ratio` = value / baseline. `target` is checked against `value` unless
    `target_on` says "ratio".
    """

    scenario: str
    name: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_label: str = ""
    target: float | None = None
    op: str = "<="  # "<=" or ">="
    target_on: str = "value"  # "value" or "ratio"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        subject = self.ratio if self.target_on == "ratio" else self.value
        if subject is None:
            return False
        return subject <= self.target if self.op == "<=" else subject >= self.target

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        what = "ratio " if self.target_on == "ratio" else ""
        return f"{what}{self.op} {fmt(self.target)}{'' if what else ' ' + self.unit}".strip()

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["ratio"] = self.ratio
        doc["met"] = self.met
        doc["target_text"] = self.target_text()
        return doc


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if value == 0:
        text = "0"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 0.01:
        text = f"{value:.3f}".rstrip("0").rstrip(".")
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}".strip() if unit else text


def percentile(values: Iterable[float], p: float) -> float:
    data = sorted(values)
    if not data:
        return math.nan
    k = (len(data) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50)


# --- the run context ------------------------------------------------------------------------------


@dataclass
class Context:
    quick: bool
    scratch: Path
    helper: str
    log: Callable[[str], None]
    shared: dict[str, Any] = field(default_factory=dict)
    # Run when the whole run ends, last added first (e.g. bringing a SLURM cluster down).
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def dir(self, name: str) -> Path:
        path = self.scratch / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path


def make_context(quick: bool, log: Callable[[str], None]) -> Context:
    scratch = Path(tempfile.mkdtemp(prefix="srtr-bench-"))
    return Context(quick=quick, scratch=scratch, helper=build_helper(scratch), log=log)


def build_helper(where: Path) -> str:
    """Compile benchmarks/helper.c (a fast-starting listener/marker); fall back to Python."""
    out = where / "helper"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("benchmarks need a C compiler (cc) for benchmarks/helper.c")
    subprocess.run([cc, "-O2", "-o", str(out), str(BENCH / "helper.c")], check=True)
    return str(out)


def raise_nofile(want: int = 65536) -> int:
    """Raise the soft open-file limit (each live local instance holds a pidfd)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(want, hard) if hard != resource.RLIM_INFINITY else want
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def save_atomic(path: Path, text: str) -> None:
    """Save like an editor that writes a temp file and renames it over the original."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- /proc ---------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` itself (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_mb(pid: int) -> float:
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


def proc_state(pid: int) -> str | None:
    """The one-letter state of `pid`, or None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def idle_sample(pid: int, seconds: float) -> dict[str, float]:
    """CPU % of one core and RSS of `pid` over `seconds` (RSS sampled once a second)."""
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    peak = rss_mb(pid)
    end = t0 + seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        peak = max(peak, rss_mb(pid))
    t1, c1 = time.monotonic(), cpu_seconds(pid)
    return {
        "cpu_percent": 100 * (c1 - c0) / (t1 - t0),
        "rss_mb": rss_mb(pid),
        "rss_peak_mb": peak,
        "threads": float(proc_status(pid)["Threads"]),
        "seconds": t1 - t0,
    }


# --- srtr jobs -----------------------------------------------------------------------------------


def another_host(run_dir: Path, view: Path, argv: str) -> list[str]:
    """`python -m srtr ARGV` as from another host: a new mount and pid namespace with a
    private /tmp, the run dir seen at `view`, and no pid of this host there.

    The private /tmp would also hide a venv or a checkout that lives under /tmp (a clone
    there: "No module named srtr"): those are held aside and bound back, as a cluster's
    shared filesystem shows them. Sockets sit at /tmp's top level, so they stay out of
    reach. (tests/runtime/test_control_channel.py runs `srtr` there too.)"""
    import srtr

    tmp = Path("/tmp").resolve()
    used = [Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix), Path(srtr.__file__)]
    kept = sorted(
        {
            tmp / p.resolve().relative_to(tmp).parts[0]
            for p in used
            if p.resolve().is_relative_to(tmp) and p.resolve() != tmp
        }
    )
    asides = [Path("/mnt") / f"{view.name}-keep{i}" for i in range(len(kept))]
    steps = [f"mount --bind {run_dir.resolve()} {view}"]
    for path, aside in zip(kept, asides, strict=True):
        aside.mkdir(exist_ok=True)
        steps.append(f"mount --bind {path} {aside}")
    steps.append("mount -t tmpfs none /tmp")
    for path, aside in zip(kept, asides, strict=True):
        steps += [f"mkdir -p {path}", f"mount --bind {aside} {path}"]
    script = " && ".join([*steps, f"exec {sys.executable} -m srtr {argv}"])
    return ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", script]


def srtr_argv() -> list[str]:
    return [sys.executable, "-m", "srtr"]


class Job:
    """`srtr up RECIPE --headless --run-dir D` as a subprocess, as a user would run it."""

    def __init__(
        self,
        recipe: Path,
        run_dir: Path,
        *,
        nodes: int | None = None,
        metrics: bool = False,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        inherit_env: bool = True,
    ) -> None:
        """`env` is added to the harness's environment, or replaces it (`inherit_env=False`,
        e.g. to keep an outer SLURM_JOB_ID from reaching a job that allocates its own)."""
        self.recipe = recipe
        self.run_dir = run_dir
        argv = [*srtr_argv(), "up", str(recipe), "--headless", "--run-dir", str(run_dir)]
        if nodes is not None:
            argv += ["--nodes", str(nodes)]
        if metrics:
            argv += ["--metrics-port", "127.0.0.1:0"]
        argv += extra or []
        run_dir.mkdir(parents=True, exist_ok=True)
        self.out = open(run_dir.parent / f"{run_dir.name}.stdout", "wb")
        self.started = time.time()
        self.proc = subprocess.Popen(
            argv,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(recipe.parent),
            env={**(os.environ if inherit_env else {}), **(env or {})},
        )
        self.pid = self.proc.pid
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    # -- reading the run dir ------------------------------------------------------------------
    def poll_events(self) -> list[dict[str, Any]]:
        """New events since the last call (also appended to `self.events`)."""
        path = self.run_dir / "events.jsonl"
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new = [json.loads(line) for line in lines if line.strip()]
        self.events += new
        return new

    def state(self) -> dict[str, Any]:
        from srtr.store.rundir import StateFileError, read_state

        for _ in range(50):
            try:  # the one reader: a big job's state.json is a snapshot, its log applied
                return dict(read_state(self.run_dir).doc)
            except StateFileError:
                time.sleep(0.05)
        raise RuntimeError(f"no readable state.json in {self.run_dir}")

    def wait(
        self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float, step: float = 0.02
    ) -> Any:
        """Poll events until `predicate(all events)` is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll_events()
            found = predicate(self.events)
            if found:
                return found
            if self.proc.poll() is not None:
                self.poll_events()
                found = predicate(self.events)
                if found:
                    return found
                raise RuntimeError(f"srtr up exited with {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting in {self.run_dir}")
            time.sleep(step)

    def count(self, reason: str, prefix: str = "") -> int:
        return sum(
            1 for e in self.events if e["reason"] == reason and e["object"].startswith(prefix)
        )

    def first(self, reason: str, contains: str = "", obj: str = "") -> dict[str, Any] | None:
        for e in self.events:
            if e["reason"] == reason and contains in e["message"] and e["object"].startswith(obj):
                return e
        return None

    def all_launched(self, total: int, timeout: float, step: float) -> tuple[float, float]:
        """Wait for `total` Launched events; seconds from `srtr up` starting, and from the
        first stage's PhaseStarted, to the last of them."""
        self.wait(lambda ev: self.count("Launched") >= total, timeout=timeout, step=step)
        last = max(e["ts"] for e in self.events if e["reason"] == "Launched")
        begin = self.first("PhaseStarted", contains="stage 1/")
        assert begin is not None
        return last - self.started, last - begin["ts"]

    def tail(self, lines: int = 15) -> str:
        self.out.flush()
        path = self.run_dir.parent / f"{self.run_dir.name}.stdout"
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])

    # -- ending it -----------------------------------------------------------------------------
    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGINT)  # second Ctrl+C: kill now
                self.proc.wait(30)
        self.out.close()
        return self.proc.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        with contextlib.suppress(Exception):
            self.out.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def launched_pid(event: dict[str, Any]) -> int | None:
    """The pid in a Launched event's message: 'on node3 (pid 1234); ...'."""
    message = event["message"]
    start = message.find("(pid ")
    if start < 0:
        return None
    return int(message[start + 5 : message.index(")", start)])


def read_marks(path: Path) -> list[tuple[int, float]]:
    """Lines 'PID EPOCH' that the helper's `mark` mode appended."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def wait_tcp(ip: str, port: int, interval: float, timeout: float) -> float:
    """Probe ip:port every `interval` until it accepts; return when (time.time())."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.settimeout(1.0)
            try:
                s.connect((ip, port))
                return time.time()
            except OSError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ip}:{port} not listening after {timeout}s")
        time.sleep(interval)


def kill_tree_of(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


# --- metrics -------------------------------------------------------------------------------------


def scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def histogram(text: str, name: str) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts of histogram `name`, per controller label."""
    out: dict[str, dict[float, float]] = {}
    prefix = f"{name}_bucket{{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].partition("} ")
        parts = dict(p.split("=", 1) for p in labels.split(","))
        le = parts["le"].strip('"')
        ctl = parts.get("controller", '""').strip('"')
        out.setdefault(ctl, {})[math.inf if le == "+Inf" else float(le)] = float(value)
    return out


def histogram_delta(
    after: dict[str, dict[float, float]], before: dict[str, dict[float, float]]
) -> dict[str, dict[float, float]]:
    return {
        ctl: {le: n - before.get(ctl, {}).get(le, 0.0) for le, n in buckets.items()}
        for ctl, buckets in after.items()
    }


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if total <= 0:
        return math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == math.inf:
                return prev_bound
            width = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / width if width else 0)
        prev_bound, prev_count = bound, count
    return bounds[-1]


def merge_histograms(per: dict[str, dict[float, float]]) -> dict[float, float]:
    merged: dict[float, float] = {}
    for buckets in per.values():
        for le, n in buckets.items():
            merged[le] = merged.get(le, 0.0) + n
    return merged
