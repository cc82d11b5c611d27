"""Command lines, output parsers and the batch script of SLURM grow jobs; pure.

A grow request is one `sbatch --array=1-N -N1` job array: each task is one node, whose batch
script runs that node's agent (`GROW_SCRIPT`). An array, not one N-node job, because a node
goes back to SLURM on its own (`scancel JOB_TASK`) whatever node it is: a running N-node job
shrinks with `scontrol update JobId=J NodeList=...` only while it keeps its batch host, and
without accounting storage (slurmdbd) SLURM 22.05 takes only the first resize of a job
("Job update not available right now, the DB index is being set", for every later one).

The tasks copy the main job's partition, account, QoS, constraints and exclusivity
(`MainJob`, from `scontrol --oneliner show job`), and its end: `--deadline` at the main
job's end with `--time-min=1`, so SLURM cuts a task's time limit to end by then.
"""

from __future__ import annotations

import datetime
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from srtr.backends.slurm.srun import check_text

# scontrol's `Key=Value` pairs; values we read have no spaces (Reason= and Command= may,
# and are not read).
_FIELD_RE = re.compile(r"(?:^|\s)([A-Za-z/:]+)=(\S*)")
_UNSET = frozenset({"", "(null)", "N/A", "NONE", "Unknown", "UNLIMITED"})

# Pending reasons under which a task never starts as asked: the request is refused, with
# SLURM's word, and not left pending for ever.
_NEVER_REASONS = (
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "DependencyNeverSatisfied",
    "MaxNodePerJob",
    "MaxNodesPerJob",
    "MaxWallDurationPerJob",
)
# Task states of a job that still holds, or waits for, its node.
_LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING"})


@dataclass(frozen=True)
class MainJob:
    """What a grow job copies from the main job."""

    partition: str = ""
    account: str = ""
    qos: str = ""
    features: str = ""
    exclusive: bool = True
    end: datetime.datetime | None = None  # None: no time limit


@dataclass(frozen=True)
class TaskRow:
    """One array task of `squeue -r` (GROW_SQUEUE_FORMAT)."""

    array_id: str
    task: int
    state: str
    reason: str
    node: str

    @property
    def running(self) -> bool:
        return self.state == "RUNNING" and bool(self.node)

    @property
    def live(self) -> bool:
        return self.state in _LIVE_STATES

    @property
    def never(self) -> bool:
        """Pending for a reason that no wait cures (a partition's or an account's limit)."""
        return self.state == "PENDING" and any(r in self.reason for r in _NEVER_REASONS)


def scontrol_show_job_argv(job_id: str) -> list[str]:
    check_text("job id", job_id)
    return ["scontrol", "--oneliner", "show", "job", job_id]


def parse_main_job(text: str) -> MainJob:
    """The main job's settings from `scontrol --oneliner show job J`."""
    fields = dict(_FIELD_RE.findall(text.splitlines()[0] if text.strip() else ""))

    def value(key: str) -> str:
        got = fields.get(key, "")
        return "" if got in _UNSET else got

    end = None
    if fields.get("TimeLimit", "UNLIMITED") not in _UNSET and value("EndTime"):
        try:
            end = datetime.datetime.fromisoformat(value("EndTime"))
        except ValueError:
            end = None
    return MainJob(
        partition=value("Partition"),
        account=value("Account"),
        qos=value("QOS"),
        features=value("Features"),
        # OverSubscribe=NO is --exclusive (22.05; older releases print Shared=0).
        exclusive=fields.get("OverSubscribe", "NO") == "NO" or fields.get("Shared") == "0",
        end=end,
    )


def sbatch_grow_argv(
    *,
    count: int,
    name: str,
    main: MainJob,
    script: PurePath,
    output: PurePath,
    now: datetime.datetime,
) -> list[str]:
    """`sbatch --parsable --array=1-N -N1 ...`: N one-node tasks, like the main job's nodes.

    Their time limit ends with the main job (`--deadline`, with `--time-min=1`); a main
    job with under a minute left gets no grow job at all (ValueError).
    """
    if count < 1:
        raise ValueError("a grow job asks for at least one node")
    check_text("job name", name)
    argv = ["sbatch", "--parsable", f"--array=1-{count}", "-N1", "--ntasks=1", "-J", name]
    argv += ["--no-requeue", f"--output={output}", "--open-mode=append"]
    if main.exclusive:
        argv.append("--exclusive")
    for flag, value in (
        ("--partition", main.partition),
        ("--account", main.account),
        ("--qos", main.qos),
        ("--constraint", main.features),
    ):
        if value:
            check_text(flag, value)
            argv.append(f"{flag}={value}")
    if main.end is not None:
        minutes = int((main.end - now).total_seconds() // 60)
        if minutes < 1:
            raise ValueError("the main job ends within a minute: no node can join it now")
        argv += [f"--time={minutes}", "--time-min=1", f"--deadline={main.end.isoformat()}"]
    return [*argv, str(script)]


GROW_SQUEUE_FORMAT = "%F|%K|%T|%r|%N"


def squeue_tasks_argv(array_ids: Sequence[str]) -> list[str]:
    """`squeue -h -r -j A,B -o ...`: every task of the grow jobs, one per line."""
    if not array_ids:
        raise ValueError("no grow job to look at")
    for job in array_ids:
        check_text("job id", job)
    return ["squeue", "-h", "-r", "-j", ",".join(array_ids), "-o", GROW_SQUEUE_FORMAT]


def parse_squeue_tasks(text: str) -> list[TaskRow]:
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[1].isdigit():
            continue  # a task range ("1-8", not split yet with -r: never), a blank line
        array_id, task, state, reason, node = parts
        rows.append(TaskRow(array_id, int(task), state, "" if reason == "None" else reason, node))
    return rows


def scancel_tasks_argv(array_id: str, tasks: Sequence[int]) -> list[str]:
    """`scancel A_1 A_3`: give single nodes back; `scancel A` (no tasks) ends them all."""
    check_text("job id", array_id)
    return ["scancel", *(f"{array_id}_{t}" for t in tasks)] if tasks else ["scancel", array_id]


def gone_from_queue(returncode: int, output: str) -> bool:
    """`squeue -j J` says J no longer exists (purged, or never was), as opposed to failing."""
    return (returncode == 0 and not output.strip()) or "Invalid job id" in output


# The batch script of every task of a run's grow jobs, written once into the run dir. It
# reads the token from the run dir's 0600 file (never argv, nor the job's stored
# environment) and the controller's address from the rendezvous file, runs the agent, and
# ends it as soon as the main job is gone: nothing can adopt the node then, and no grow job
# may outlive its run (a kill -9 of srtr inside the main job takes its guard along too).
GROW_SCRIPT = """\
#!/bin/sh
# srtr: the node agent of a node that joined run {run} (a grow job; docs/recipe.md).
run={run_dir}
main={main_job}
SRTR_AGENT_TOKEN=$(cat "$run/{token_file}") || exit 1
export SRTR_AGENT_TOKEN
export SRTR_AGENT_FINGERPRINT={fingerprint}
{python} -m srtr.backends.agent.node --controller "$(cat "$run/{rendezvous}")" \\
    --adopt-window {window} --rendezvous "$run/{rendezvous}" \\
    --node-env SLURMD_NODENAME --inherit all --log-dir "$run/logs" &
agent=$!
# scancel (a release, the end of the run): the agent ends; the script must not start
# another `sleep` that SLURM then waits out until KillWait.
trap 'kill -TERM $agent 2>/dev/null; exit 143' TERM
# The first look is one period in: every task of a grow job starts at once, and N squeue
# calls then would take CPU and slurmctld's time from the agents that are starting. The
# agent's liveness is read after each sleep, so an agent that ended during it costs no squeue.
while sleep {period} & wait $!; kill -0 $agent 2>/dev/null; do
    out=$(squeue -h -j "$main" -o %T 2>&1)
    rc=$?
    case "$rc:$out" in
        0:RUNNING*|0:CONFIGURING*|0:SUSPENDED*|0:RESIZING*) ;;
        *"Invalid job id"*|0:*)
            echo "srtr grow job: main job $main is gone (${{out:-purged}}); ending the agent"
            kill -TERM $agent 2>/dev/null
            break ;;
    esac
done
wait $agent
"""


def grow_script(
    *,
    run: str,
    run_dir: PurePath,
    main_job: str,
    python: str,
    window: float,
    fingerprint: str,
    files: Mapping[str, str],
    period: float = 5.0,
) -> str:
    """The grow jobs' batch script; `files`: the run dir's token and rendezvous file names."""
    return GROW_SCRIPT.format(
        run=shlex.quote(run),
        run_dir=shlex.quote(str(run_dir)),
        main_job=shlex.quote(main_job),
        python=shlex.quote(python),
        window=f"{window:g}",
        fingerprint=shlex.quote(fingerprint),
        token_file=files["token"],
        rendezvous=files["rendezvous"],
        period=f"{period:g}",
    )
