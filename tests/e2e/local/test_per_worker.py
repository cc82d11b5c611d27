"""`placement.per: worker` for real: one process per engine worker, in that worker's GPU view.

Two 1-GPU agg workers on one 2-GPU node and a per-worker service beside them: each instance is
a real process that prints the `CUDA_VISIBLE_DEVICES` it was started with, and the assertion
reads it back from that instance's own log (reference T-94, S-53 step 5).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance

pytestmark = pytest.mark.e2e

RECIPE = """
name: perworker
resources: {gpus_per_node: 2}
roles:
  agg: {nodes: 1, workers: 2, gpus: 1, command: ["sleep", "1000"]}
services:
  - name: gpu-watch
    command:
      - sh
      - -c
      - >-
        echo "view=$CUDA_VISIBLE_DEVICES gpus={worker_gpus} of {worker_gpu_count}
        worker={worker_role}/{worker_index}"; echo watching; exec sleep 1000
    start: before_workers
    placement: {node: agg, per: worker}
    readiness: {log: {pattern: watching}, timeout_seconds: 30}
benchmark:
  type: custom
  command: "true"
"""


def test_each_per_worker_instance_sees_its_own_gpu(tmp_path: Path) -> None:
    run = Run(tmp_path, RECIPE, env={**os.environ, "CUDA_VISIBLE_DEVICES": "5"})
    code = run.finish()
    assert code == 0, run.err
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Succeeded"
    logs = run.run_dir / "logs"
    for k in (0, 1):
        name = f"service_gpu-watch_agg_{k}_node1"
        assert instance(state, name)["node"] == "node1"
        first = (logs / f"{name}.out").read_text().splitlines()[0]
        # The worker's view replaces whatever the job inherited (`5` here).
        assert first == f"view={k} gpus={k} of 1 worker=agg/{k}"


GPU_KINDS = """
name: gpukinds
resources: {gpus_per_node: 2}
roles:
  agg: {nodes: 1, workers: 2, gpus: 1, command: ["sleep", "1000"]}
services:
  - {name: mooncake-master, type: mooncake-master}
  - {name: gms, type: gms}
benchmark:
  type: custom
  command: "true"
"""


def test_gpu_kinds_without_their_programs_are_skipped_and_the_job_runs(tmp_path: Path) -> None:
    """Here neither `mooncake_master` nor the `gpu_memory_service` module is installed."""
    run = Run(tmp_path, GPU_KINDS, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert run.finish() == 0, run.err
    state = run.state()
    assert state is not None and state["job"]["phase"] == "Succeeded"
    missing = [e["message"] for e in events(run.run_dir) if e["reason"] == "ProgramMissing"]
    expected, skipped = [], []
    if shutil.which("mooncake_master", path="/usr/bin:/bin") is None:
        expected.append(
            "mooncake-master: binary 'mooncake_master' not found on PATH; skipping its 1 "
            "instance(s)"
        )
        skipped.append("service_mooncake-master")
    if importlib.util.find_spec("gpu_memory_service") is None:
        expected.append(
            "gms: Python module 'gpu_memory_service' not found; skipping its 2 instance(s)"
        )
        skipped += ["service_gms_agg_0_node1", "service_gms_agg_1_node1"]
    assert missing == expected
    for name in skipped:
        row = instance(state, name)
        assert (row["phase"], row["pid"]) == ("Succeeded", None), row  # never launched
    assert instance(state, "worker_agg_1")["phase"] == "Stopped"  # the workers ran
