"""TUI at scale: `srtr up --hollow` on a real pseudo-terminal, N hollow nodes × M instances.

The TUI runs as a user runs it: `srtr up RECIPE --hollow` (no `--headless`) with a pty as
its terminal, whose output `pyte` draws into a screen that a thread keeps reading (a pty
nobody reads would block the program). Figures:

- first frame: from `srtr up` starting (and from state.json first existing) to the
  instances table on screen with rows;
- time to all Running (the last `Launched` event), to compare with a headless run of the
  same job (`headless=True` runs one first, and its processes are gone, its guard's last
  read of its state included, before the TUI's job starts);
- a keystroke's answer: from the key written to the pty to the screen showing its effect:
  `o` (sort by the next column: the heading's arrow), `j` (the cursor to the next row:
  the detail pane's title) and a `/` filter (rows of only the matching service);
- idle CPU and RSS of `srtr up` once all are Running and settled (its state files unchanged
  for 2 s, `settled`, and its processes below a tenth of a core, `quiet`), over two laps
  of the controller's periodic reads (`IDLE_SECONDS`, 32 s): of every process it runs
  (`up_processes`: the controller, the TUI's own process, a guard), but the simulated nodes
  (the hollow process), whose CPU a real job spends on its compute nodes. CPU is summed
  over them, RSS too.

`measure(ctx, nodes, per_node)` is the hook a larger scenario calls; `run(ctx)` measures
1,024 × 4 (256 × 4 with --quick). Large runs must hold the benchmark lock:
`flock /tmp/srtr-bench.lock python3 -m benchmarks.tui_scale 4096 4`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyte

from benchmarks.common import (
    Context,
    Figure,
    Job,
    cpu_seconds,
    idle_sample,
    make_context,
    raise_nofile,
    rss_mb,
    srtr_argv,
    write_yaml,
)
from benchmarks.hollow import pids_with
from srtr.backends.agent.channel import READ_PERIOD
from srtr.store.rundir import StateFileError, read_state, read_summary, state_version

COLUMNS, LINES = 160, 50
FIRST_FRAME_TARGET = 2.0  # s
KEY_TARGET = 200.0  # ms
IDLE_TARGET = 3.0  # % of one core
# The idle sample spans two whole laps of the controller's periodic reads (each reads every
# watched socket and an even share of those relays vouch for): a sample of part of a lap
# reads low or high by its phase.
IDLE_SECONDS = 2 * READ_PERIOD
QUIET_SHARE = 0.1  # of a core: the processes are done with the launch's end below this
RUNNING_RATIO_TARGET = 1.2  # × headless


def recipe(path: Path, nodes: int, per_node: int) -> Path:
    """One pool of `nodes` nodes: an owner and `per_node - 1` riders on each."""
    services: list[dict[str, Any]] = [
        {"name": "base", "command": ["sleep", "infinity"], "nodes": nodes}
    ]
    for i in range(1, per_node):
        services.append(
            {"name": f"side{i}", "command": ["sleep", "infinity"], "placement": {"pool": "base"}}
        )
    return write_yaml(path, {"name": "tuiscale", "services": services})


class Screen:
    """The pty's screen, kept up to date by a thread; `wait` polls it for a condition."""

    def __init__(self, master: int, proc: subprocess.Popen[bytes]) -> None:
        self.master = master
        self.proc = proc
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        self.done = False
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while not self.done:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(self.master, 1 << 16)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.stream.feed(data)

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.screen.display)

    def wait(self, check: Callable[[str], bool], timeout: float, what: str) -> float:
        """Seconds until `check(screen)` holds (polled every 5 ms)."""
        started = time.monotonic()
        while not check(self.text()):
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{what}: not on screen after {timeout}s:\n{self.text()}")
            if self.proc.poll() is not None:
                raise RuntimeError(f"srtr up exited ({self.proc.returncode}):\n{self.text()}")
            time.sleep(0.005)  # the screen is read as the TUI draws: 5 ms is the resolution
        return time.monotonic() - started


class TuiJob(Job):
    """`srtr up RECIPE --hollow` with a pty for its terminal (the TUI on)."""

    def __init__(self, recipe_path: Path, run_dir: Path, argv: list[str] | None = None) -> None:
        """`argv`: another srtr command than `up` (`srtr tui RUN_DIR`)."""
        self.recipe, self.run_dir = recipe_path, run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if argv is None:
            argv = [*srtr_argv(), "up", str(recipe_path), "--run-dir", str(run_dir), "--hollow"]
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLUMNS)}
        self.out = open(run_dir.parent / f"{run_dir.name}.stdout", "wb")
        self.started = time.time()
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=str(recipe_path.parent),
            env={**env, "LINES": str(LINES)},
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.master = master
        self.pid = self.proc.pid
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""
        self.screen = Screen(master, self.proc)

    def key(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)
        for pid in [self.pid, *pids_with(str(self.run_dir))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.screen.done = True
        with contextlib.suppress(OSError):
            os.close(self.master)
        with contextlib.suppress(Exception):
            self.out.close()


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def up_processes(pid: int) -> list[int]:
    """`pid` and every process under it, but the simulated nodes' (`srtr.backends.agent`)."""
    out, todo = [], [pid]
    while todo:
        here = todo.pop()
        try:
            argv = Path(f"/proc/{here}/cmdline").read_bytes()
            todo += _children(here)
        except OSError:
            continue  # gone meanwhile
        if b"srtr.backends.agent" not in argv:
            out.append(here)
    return out


def idle_of_up(pid: int, seconds: float) -> dict[str, float]:
    """`idle_sample` summed over `up_processes(pid)` (as found when the sample starts)."""
    pids = up_processes(pid)
    start = {p: cpu_seconds(p) for p in pids}
    t0 = time.monotonic()
    samples = [idle_sample(p, seconds) for p in pids[:1]]
    elapsed = time.monotonic() - t0
    cpu = sum(_cpu_or(p, start[p]) - start[p] for p in pids)
    out = dict(samples[0])
    out["cpu_percent"] = 100 * cpu / elapsed
    out["rss_mb"] = sum(_rss_or_zero(p) for p in pids)
    out["processes"] = float(len(pids))
    return out


def _cpu_or(pid: int, default: float) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return default


def _rss_or_zero(pid: int) -> float:
    try:
        return rss_mb(pid)
    except (OSError, KeyError):
        return 0.0


def _rows_shown(screen: str) -> bool:
    return "NAME" in screen and re.search(r"\bservice_\w+_node\d+", screen) is not None


TABLE_ROW = re.compile(r"│ (service_\w+?)_node\d+ +[A-Z][a-z]+ +(?:yes|no) ")


def _only_side3(screen: str) -> bool:
    services = TABLE_ROW.findall(screen)
    return bool(services) and all(s == "service_side3" for s in services)


def _answer(job: TuiJob, keys: str, check: Callable[[str], bool], what: str) -> float:
    """ms from `keys` written to the screen showing what they do."""
    started = time.monotonic()
    job.key(keys)
    job.screen.wait(check, 30, what)
    return (time.monotonic() - started) * 1000


def _keystrokes(job: TuiJob) -> dict[str, float]:
    out: dict[str, float] = {}
    out["sort_ms"] = _answer(job, "o", lambda s: "NAME ▲" in s, "the NAME ▲ heading")
    title = re.compile(r"─ (service_\w+) ─")

    def detail_title(screen: str) -> str | None:
        found = title.search(screen)
        return found.group(1) if found else None

    before = job.screen.wait(lambda s: detail_title(s) is not None, 10, "a detail pane")
    del before
    first = detail_title(job.screen.text())
    out["cursor_ms"] = _answer(job, "j", lambda s: detail_title(s) not in (None, first), "j")
    job.key("/")
    # The bar itself (its placeholder), not the footer's "/ Filter", which is always there:
    # keys typed before the bar has the focus would be lost.
    job.screen.wait(lambda s: "words match any column" in s, 10, "the filter bar")
    # Every rider's rows (sorted by name: side1's on top); the keystroke measured then
    # narrows them to side3's, which were not on screen before it.
    job.key("side")
    job.screen.wait(
        lambda s: bool(TABLE_ROW.findall(s)) and "service_base" not in TABLE_ROW.findall(s),
        30,
        "the riders' rows",
    )
    out["filter_ms"] = _answer(job, "3", _only_side3, "the filtered rows")
    job.key("\x1b")  # Esc: the filter is cleared
    return out


def measure(ctx: Context, nodes: int, per_node: int, *, headless: bool = False) -> dict[str, Any]:
    """The TUI's figures on `nodes` hollow nodes × `per_node` instances (see the module)."""
    where = ctx.dir(f"tui_scale_{nodes}x{per_node}")
    path = recipe(where / "tuiscale.yaml", nodes, per_node)
    total = nodes * per_node
    out: dict[str, Any] = {"nodes": nodes, "per_node": per_node, "instances": total}
    if headless:
        with Job(path, where / "headless", extra=["--hollow"]) as job:
            out["headless_running_s"] = job.all_launched(total, timeout=600, step=0.2)[0]
        ctx.log(f"tui_scale: headless all {total:,} Running in {out['headless_running_s']:.1f}s")
        _gone(where / "headless")
    with TuiJob(path, where / "tui") as tui:
        state_file = where / "tui" / "state.json"
        state_at: list[float] = []

        def first_rows(screen: str) -> bool:
            if not state_at and state_file.exists():
                state_at.append(time.time())
            return _rows_shown(screen)

        out["first_frame_s"] = tui.screen.wait(first_rows, 600, "the first rows")
        out["first_frame_after_state_s"] = time.time() - (state_at or [time.time()])[0]
        out["tui_running_s"] = tui.all_launched(total, timeout=600, step=0.2)[0]
        ctx.log(
            f"tui_scale: first frame {out['first_frame_s']:.2f}s "
            f"({out['first_frame_after_state_s']:.2f}s after state.json); all {total:,} Running in "
            f"{out['tui_running_s']:.1f}s with the TUI on"
        )
        # Idle is the job holding still: its state's last writes (instances that finished
        # starting after the last Launched) and the frames they cause are not idle.
        out["settled_after_s"] = settled(where / "tui", running=total)
        # ... and the processes are done with the work the last changes left them (the TUI
        # builds every row of 80,000 once the state holds still, for a sort or a filter).
        out["quiet_after_s"] = quiet(up_processes(tui.pid))
        out["idle"] = idle_of_up(tui.pid, IDLE_SECONDS)
        ctx.log(
            f"tui_scale: idle {out['idle']['cpu_percent']:.1f}% CPU, "
            f"RSS {out['idle']['rss_mb']:.0f} MB ({out['idle']['processes']:.0f} processes)"
        )
        out.update(_keystrokes(tui))
        ctx.log(
            f"tui_scale: keys: sort {out['sort_ms']:.0f} ms, cursor {out['cursor_ms']:.0f} ms, "
            f"filter {out['filter_ms']:.0f} ms"
        )
    return out


def _gone(run_dir: Path, timeout: float = 60.0) -> None:
    """Wait until no process of the job in `run_dir` is left. Its controller is gone when
    `Job` returns, but its guard then reads the job's whole state (63 MB at 10,000 x 8:
    ~2 s of a core): the next job's figures are not to share the machine with it."""
    deadline = time.monotonic() + timeout
    while pids_with(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)


def settled(
    run_dir: Path, quiet: float = 2.0, timeout: float = 120.0, running: int | None = None
) -> float:
    """Wait until the run dir's state files went `quiet` seconds unchanged and (`running`)
    say that many instances are Running (then one more second for the TUI's frame of the
    last change); the seconds it took. The controller spaces its writes by eight times the
    last one's cost, so a big job's last write (the records of the instances that became
    Running after the last Launched) can come more than `quiet` after the one before."""
    start = time.monotonic()
    seen, since = state_version(run_dir), start
    while time.monotonic() - since < quiet or (running is not None and _running(run_dir) < running):
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{run_dir}: the state still changes after {timeout:.0f}s")
        time.sleep(0.2)
        now = state_version(run_dir)
        if now != seen:
            seen, since = now, time.monotonic()
    time.sleep(1.0)
    return time.monotonic() - start


def quiet(pids: list[int], share: float = QUIET_SHARE, timeout: float = 60.0) -> float:
    """Wait until `pids` together used less than `share` of a core over a second (or
    `timeout` passed: the sample then shows what keeps them busy); the seconds it took.
    Far above an idle `srtr up` (a few %): only the one-off work of the launch's end is
    waited for, and anything that comes again is in the sample."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = sum(_cpu_or(p, 0.0) for p in pids)
        time.sleep(1.0)
        if sum(_cpu_or(p, 0.0) for p in pids) - before < share:
            break
    return time.monotonic() - start


def _running(run_dir: Path) -> int:
    """The instances Running in the state as written: summary.json's counts for a big job
    (at most 2 s behind its state files), else state.json's records."""
    summary = read_summary(run_dir)
    if summary is not None:
        return sum(int(s.get("phases", {}).get("Running", 0)) for s in summary["services"])
    try:
        return sum(i.get("phase") == "Running" for i in read_state(run_dir).instances)
    except StateFileError:
        return 0


def big_state(template: Path, nodes: int, per_node: int) -> dict[str, Any]:
    """A state.json of `nodes` × `per_node` instances, all Running, made from a real one
    (`template`, of the same recipe) by repeating its first node's documents."""
    doc = json.loads(template.read_text(encoding="utf-8"))
    first = doc["nodes"][0]
    own = [i for i in doc["instances"] if i["node"] == first["name"]]
    doc["nodes"] = [
        {**first, "name": f"node{n}", "ip": f"127.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"}
        for n in range(1, nodes + 1)
    ]
    doc["pools"][0]["nodes"] = [node["name"] for node in doc["nodes"]]
    doc["instances"] = [
        {
            **inst,
            "name": f"service_{inst['service']}_{node['name']}",
            "node": node["name"],
            "node_ip": node["ip"],
            "log": f"logs/service_{inst['service']}_{node['name']}.out",
        }
        for node in doc["nodes"]
        for inst in own[:per_node]
    ]
    return doc


def measure_view(ctx: Context, template: Path, nodes: int, per_node: int) -> dict[str, Any]:
    """`srtr tui` on a state.json of `nodes` × `per_node` (made from `template`): the first
    frame, the keystrokes and its idle CPU, for sizes no hollow job fits on this host."""
    where = ctx.dir(f"tui_view_{nodes}x{per_node}")
    run_dir = where / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("")
    (run_dir / "state.json").write_text(json.dumps(big_state(template, nodes, per_node)))
    out: dict[str, Any] = {"nodes": nodes, "per_node": per_node}
    argv = [*srtr_argv(), "tui", str(run_dir)]
    with TuiJob(template, run_dir, argv=argv) as tui:
        out["first_frame_s"] = tui.screen.wait(_rows_shown, 600, "the first rows")
        time.sleep(2)
        out["idle"] = idle_of_up(tui.pid, 10.0)
        out.update(_keystrokes(tui))
    ctx.log(
        f"tui_scale: srtr tui on {nodes * per_node:,} instances: first frame "
        f"{out['first_frame_s']:.2f}s; idle {out['idle']['cpu_percent']:.1f}% CPU, RSS "
        f"{out['idle']['rss_mb']:.0f} MB; keys: sort {out['sort_ms']:.0f} ms, cursor "
        f"{out['cursor_ms']:.0f} ms, filter {out['filter_ms']:.0f} ms"
    )
    return out


def figures(out: dict[str, Any]) -> list[Figure]:
    size = f"{out['nodes']:,} × {out['per_node']} hollow"
    keys = max(out["sort_ms"], out["cursor_ms"], out["filter_ms"])
    figs = [
        Figure(
            "tui_scale",
            f"TUI first frame, {size}",
            out["first_frame_s"],
            "s",
            target=FIRST_FRAME_TARGET,
        ),
        Figure(
            "tui_scale",
            f"TUI keystroke answer (slowest of sort, cursor, filter), {size}",
            keys,
            "ms",
            target=KEY_TARGET,
            note=f"sort {out['sort_ms']:.0f}, cursor {out['cursor_ms']:.0f}, "
            f"filter {out['filter_ms']:.0f} ms",
        ),
        Figure(
            "tui_scale",
            f"srtr up with the TUI: idle CPU, {size}",
            out["idle"]["cpu_percent"],
            "%",
            target=IDLE_TARGET,
            note=f"RSS {out['idle']['rss_mb']:.0f} MB",
        ),
    ]
    if "headless_running_s" in out:
        figs.append(
            Figure(
                "tui_scale",
                f"srtr up with the TUI: all Running, {size}",
                out["tui_running_s"],
                "s",
                baseline=out["headless_running_s"],
                baseline_label="headless",
                target=RUNNING_RATIO_TARGET,
                target_on="ratio",
            )
        )
    return figs


def run(ctx: Context) -> list[Figure]:
    nodes = 256 if ctx.quick else 1024
    return figures(measure(ctx, nodes, 4, headless=True))


if __name__ == "__main__":
    # python3 -m benchmarks.tui_scale NODES PER_NODE [--no-headless] [--view NODES]
    raise_nofile()
    context = make_context(False, lambda line: print(line, flush=True))
    args = sys.argv[1:]
    nodes, per_node = int(args[0]), int(args[1])
    result = measure(context, nodes, per_node, headless="--no-headless" not in args)
    for figure in figures(result):
        print(figure.name, figure.value, figure.unit, figure.note)
    if "--view" in args:
        view_nodes = int(args[args.index("--view") + 1])
        template = context.scratch / f"tui_scale_{nodes}x{per_node}" / "tui" / "state.json"
        measure_view(context, template, view_nodes, per_node)
