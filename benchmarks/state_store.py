"""The run dir's state at the largest size, with no live job: bytes per restart, `srtr status`.

A synthetic store of NODES nodes × PER_NODE instances (a pool on every node with riders,
10,000 × 8 = 80,000 by default) is brought to all Running through the store's own
transitions, written by the state writer (`srtr.store.state_log`), and then one instance
restarts (exit, backoff, relaunch) with a write after each step, as the controller coalesces
them. It prints:

- the bytes written to the run dir for that restart, and what a whole rewrite per write
  (the writer's small-job mode, and every job's before the delta log) would have written;
- the time of one write (delta), of a compaction (the snapshot from the kept records) and of
  one whole document (what every write cost before);
- the time the writes of a teardown take: every instance Terminating, then exited, then the
  job's last write (state.json whole again), a write after each;
- `srtr status RUN` (the summary) and `srtr status RUN -o json` wall times, and the time
  of `read_state` (snapshot + deltas), each the best of 3.

    flock /tmp/srtr-bench.lock python3 -m benchmarks.state_store [NODES] [PER_NODE]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from srtr.reconciler.clock import FakeClock
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from srtr.store.persist import head, snapshot
from srtr.store.rundir import read_state
from srtr.store.state_log import SUMMARY_PERIOD, StateWriter
from srtr.store.store import Store


def recipe(nodes: int, per_node: int) -> str:
    riders = "".join(
        f"  - name: rider{i}\n    command: [sleep, inf]\n    placement: {{pool: train}}\n"
        for i in range(per_node - 1)
    )
    return (
        "name: largest\nservices:\n  - name: train\n    command: [sleep, inf]\n"
        f"    nodes: {nodes}\n    restart: {{policy: always, backoff_seconds: 1}}\n" + riders
    )


def running_store(nodes: int, per_node: int) -> Store:
    _, desired = plan_text_source(recipe(nodes, per_node), "recipe.yaml", local_allocation(nodes))
    clock = FakeClock()
    store = Store(desired, clock)
    for pid, name in enumerate(store.specs, start=1000):
        store.activate(name)
        store.launching(name, log_offset=0)
        store.launched(name, pid=pid, identity={"pid": pid, "start": pid * 7})
    return store


NOW = [0.0]  # the writer's clock: summary.json's period passes when the benchmark says


def write(writer: StateWriter, store: Store) -> tuple[int, float]:
    started = time.perf_counter()
    writer.write(dict(head(store, backend="local", controller_pid=1)), store)
    return writer.written, time.perf_counter() - started


def restart(store: Store, writer: StateWriter, name: str) -> tuple[int, float]:
    """One instance's restart, a write after each step, and the write that is due once
    summary.json's period is over; (bytes written, slowest write)."""
    total, slowest = 0, 0.0
    attempt = store.status[name].attempt
    steps = [
        lambda: store.exited(name, attempt=attempt, exit_code=1, signal=None),
        lambda: store.backing_off(
            name,
            start_at=store.clock.now() + 1,
            delay=1,
            backoff_index=1,
            restarts=1,
            window_start=store.clock.now() - 600,
            code=1,
        ),
        lambda: store.launching(name, log_offset=0),
        lambda: store.launched(name, pid=99, identity={"pid": 99, "start": 1}),
    ]
    for step in [*steps, lambda: NOW.__setitem__(0, NOW[0] + SUMMARY_PERIOD)]:
        step()
        written, took = write(writer, store)
        total, slowest = total + written, max(slowest, took)
    return total, slowest


def teardown(store: Store, writer: StateWriter) -> float:
    """The writes of a teardown: all Terminating, then all exited, then the last write."""
    store.begin_teardown(exit_code=0, reason="SIGTERM")
    names, spent = list(store.specs), 0.0
    for step in [
        lambda: [store.terminating(n, at=store.clock.now()) for n in names],
        lambda: [
            store.exited(n, attempt=store.status[n].attempt, exit_code=None, signal=15)
            for n in names
        ],
        lambda: (store.job_finished(), writer.finish()),
    ]:
        step()
        spent += write(writer, store)[1]
    return spent


def best(argv: list[str], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return min(times)


def main(nodes: int = 10_000, per_node: int = 8) -> dict[str, float]:
    store = running_store(nodes, per_node)
    run_dir = Path(tempfile.mkdtemp(prefix="srtr-state-"))
    writer = StateWriter(run_dir, clock=lambda: NOW[0])
    _, first = write(writer, store)  # the snapshot
    started = time.perf_counter()
    whole = json.dumps(snapshot(store, backend="local", controller_pid=1), separators=(",", ":"))
    whole_time = time.perf_counter() - started
    name = next(iter(store.specs))
    restart_bytes, slowest = restart(store, writer, name)
    writer.finish()  # the job's last write: a compaction from the kept records
    _, compaction = write(writer, store)
    restart(store, writer, name)  # a log to read again
    started = time.perf_counter()
    state = read_state(run_dir)
    read_time = time.perf_counter() - started
    assert len(state.instances) == len(store.specs)
    # A writer of its own: `writer` wrote its last write above (each write compacts now).
    fresh = StateWriter(Path(tempfile.mkdtemp(prefix="srtr-state-")), clock=lambda: NOW[0])
    write(fresh, store)
    teardown_time = teardown(store, fresh)
    status = [sys.executable, "-m", "srtr", "status", str(run_dir)]
    figures = {
        "instances": len(store.specs),
        "state_json_bytes": (run_dir / "state.json").stat().st_size,
        "restart_bytes": restart_bytes,
        "restart_bytes_whole_rewrites": 4 * (len(whole) + 1),  # 4 writes, each whole
        "snapshot_write_s": round(first, 3),
        "slowest_delta_write_s": round(slowest, 4),
        "whole_document_s": round(whole_time, 3),
        "compaction_s": round(compaction, 3),
        "teardown_writes_s": round(teardown_time, 3),
        "read_state_s": round(read_time, 3),
        "status_summary_s": round(best(status), 3),
        "status_json_s": round(best([*status, "-o", "json"], runs=1), 3),
    }
    return figures


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    for key, value in main(*args).items():
        print(f"{key}: {value}")
