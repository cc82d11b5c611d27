"""`gms`: Dynamo's GPU Memory Service beside every engine worker.

One instance per worker (`placement.per: worker`), in that worker's device view: GMS names its
sockets after device k as NVML sees it while the engine picks device k by CUDA index, and the
two only agree inside the worker's own `CUDA_VISIBLE_DEVICES`. A bash supervisor starts one
server per GPU of the worker and prints `GMS ready:` once each has bound its two sockets.

srtctl implies it from `engine.failover`, which srtr does not have: declare it explicitly.
The program needs GPUs and does not install here; a missing module skips the instance.
"""

from __future__ import annotations

import re

from srtr.resources.kinds.base import Kind, Options, Requirement, log_probe, register

READY_MARKER = "GMS ready:"
SOCKETS_PER_DEVICE = 2  # one per logical pool: weights, kv_cache
STARTUP_TIMEOUT_SECONDS = 120  # the script's own deadline; the probe waits 30 s longer
# srtctl puts the sockets in the failover dir; srtr has no failover, so a per-worker dir
# under /tmp, named so two jobs' workers never share one.
SOCKET_DIR = "/tmp/srtr-gms/{job_name}/{worker_role}-{worker_index}-{worker_node_rank}"

# `{worker_gpu_count}` and `{job_name}`-style keys are placeholders, rendered per instance;
# bash's own `${...}` and `$((...))` are left alone (no known key inside).
_SCRIPT = f"""set -u
dir="$GMS_SOCKET_DIR"
mkdir -p "$dir" && rm -f "$dir"/gms_*.sock || exit 1
devices={{worker_gpu_count}}
expected=$(( {SOCKETS_PER_DEVICE} * devices ))
pids=()
for device in $(seq 0 $(( devices - 1 ))); do
    python3 -m gpu_memory_service --device "$device" &
    pids+=($!)
done
stopping=0
stop() {{ stopping=1; kill -TERM "${{pids[@]}}" 2>/dev/null; }}
trap stop TERM INT
count=0
limit={STARTUP_TIMEOUT_SECONDS}
for _ in $(seq 1 "$limit"); do
    for pid in "${{pids[@]}}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "GMS server pid $pid exited during startup" >&2
            stop; wait; exit 1
        fi
    done
    count=$(ls "$dir"/gms_*.sock 2>/dev/null | wc -l)
    if [ "$count" -ge "$expected" ]; then break; fi
    sleep 1
done
if [ "$count" -lt "$expected" ]; then
    echo "GMS startup timed out: $count of $expected sockets in $dir after ${{limit}}s" >&2
    stop; wait; exit 1
fi
echo "{READY_MARKER} $devices device(s), $count sockets in $dir"
wait -n "${{pids[@]}}"
rc=$?
if [ "$stopping" = 1 ]; then
    wait
    rm -rf -- "$dir"
    exit 0
fi
echo "GMS server exited (code=$rc); stopping the rest" >&2
stop; wait
if [ "$rc" = 0 ]; then rc=1; fi
exit "$rc"
"""


def _command(options: Options) -> list[str]:
    return ["bash", "-c", _SCRIPT]


register(
    Kind(
        name="gms",
        default_command=_command,
        default_start="before_workers",
        default_critical=True,
        default_placement="workers",
        default_per="worker",
        default_readiness=lambda o: log_probe(
            re.escape(READY_MARKER), timeout=STARTUP_TIMEOUT_SECONDS + 30, interval=1.0
        ),
        # Forced: the supervisor and the engine must agree on where the sockets are.
        forced_env=lambda s, r: {"GMS_SOCKET_DIR": SOCKET_DIR},
        requires=Requirement(
            "per",
            "worker",
            "services[{name}] (type gms) runs one instance per worker in that worker's device "
            "view; set placement.per: worker",
        ),
        module="gpu_memory_service",
    )
)
