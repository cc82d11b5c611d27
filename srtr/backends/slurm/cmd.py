"""Command lines and output parsers for the SLURM backend; pure (no processes are started here).

Every builder returns an argv list meant for `subprocess` without a shell, and every parser
takes the text a command printed. The formats were checked on a real SLURM 22.05.8 cluster
(`scripts/slurm-cluster`); docs/slurm-facts.md records what was measured and why the command
lines look the way they do. The points that shaped this module:

- `salloc --no-shell` prints nothing on stdout; it reports `salloc: Granted job allocation N`
  on stderr and returns once the allocation exists (it blocks while the job is pending).
  Without `--no-kill`, the loss of one node ends the whole allocation and every step in it.
- srun's command lines (an instance's step, the agents' step) are built in `slurm_srun`
  and re-exported here; its docstring says what shaped them.
- `scancel --signal=S J.S` without `--ctld` asks every node of the job and fails (exit 225,
  "Invalid job id specified") on the nodes that do not run the step even though the signal was
  delivered, yet it exits 0 for a step that does not exist. With `--ctld` the exit status is
  right both ways.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from srtr.backends.slurm.srun import (
    agents_srun_argv,
    check_text,
    parse_pyxis,
    parse_srun_node_failure,
    parse_srun_oom,
    srun_argv,
    srun_client_env,
    srun_help_argv,
    steers_srun,
)

__all__ = [
    "SQUEUE_STEP_FORMAT",
    "NodeRow",
    "StepRow",
    "agents_srun_argv",
    "node_is_down",
    "parse_end_time",
    "parse_hostnames",
    "parse_job_running",
    "parse_pyxis",
    "parse_salloc_job_id",
    "parse_salloc_pending_job_id",
    "parse_sbatch_job_id",
    "parse_scontrol_nodes",
    "parse_squeue_nodes",
    "parse_squeue_steps",
    "parse_srun_node_failure",
    "parse_srun_oom",
    "salloc_argv",
    "sbatch_argv",
    "scancel_cancel_steps_argv",
    "scancel_job_argv",
    "scancel_step_argv",
    "scancel_steps_argv",
    "scontrol_show_hostnames_argv",
    "scontrol_show_node_argv",
    "squeue_end_time_argv",
    "squeue_nodes_argv",
    "squeue_state_argv",
    "squeue_steps_argv",
    "srun_argv",
    "srun_client_env",
    "srun_help_argv",
    "steers_srun",
]

# `squeue --steps --Format`: a field with ":" but no size is printed unpadded, followed by the
# suffix (here "|"). The step name goes last so that a "|" inside a name cannot shift fields.
SQUEUE_STEP_FORMAT = "StepId:|,StepState:|,Nodes:|,StepName:"

_SIGNAL_RE = re.compile(r"[A-Z0-9]+")
_GRANTED_RE = re.compile(r"Granted job allocation (\d+)")
_PENDING_RE = re.compile(r"Pending job allocation (\d+)")
_NODE_FIELD_RES = {
    key: re.compile(rf"(?:^|\s){key}=(\S*)") for key in ("NodeName", "NodeAddr", "State", "CPUTot")
}
_REASON_RE = re.compile(r"(?:^|\s)Reason=(.*)$")

# Node state words (scontrol prints e.g. DOWN+NOT_RESPONDING, sinfo prints drained, down*)
# that mean steps cannot run there, or will not for long.
_DOWN_STATE_WORDS = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "NO_RESPOND",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "REBOOT_ISSUED",
        "INVAL",
    }
)


@dataclass(frozen=True)
class StepRow:
    """One line of `squeue --steps` in SQUEUE_STEP_FORMAT.

    `step_id` is the part after the dot ("0", "12", "extern"); `job_id` the part before it.
    `nodes` is a hostlist expression such as "node3" or "node[1-2]".
    """

    step_id: str
    name: str
    nodes: str
    state: str
    job_id: str = ""

    @property
    def full_id(self) -> str:
        """`JOB.STEP`, as scancel and squeue spell a step."""
        return f"{self.job_id}.{self.step_id}"


@dataclass(frozen=True)
class NodeRow:
    """One node of `scontrol --oneliner show node`. `state` is e.g. IDLE, IDLE+DRAIN; `cpus`
    is CPUTot (None when not printed)."""

    name: str
    addr: str
    state: str
    reason: str = ""
    cpus: int | None = None

    @property
    def down(self) -> bool:
        return node_is_down(self.state)


# --- salloc ------------------------------------------------------------------------------------


def salloc_argv(
    *,
    nodes: int,
    job_name: str,
    partition: str | None = None,
    account: str | None = None,
    time_limit: str | None = None,
    no_kill: bool = True,
    exclusive: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """`salloc --no-shell -N <nodes> -J <name> ...`: allocate and return, keeping no shell.

    `no_kill` (default) keeps the allocation alive when one of its nodes fails: without it
    SLURM cancels the whole job, every step included. `exclusive` (default) asks for whole
    nodes, which select/cons_tres clusters do not give otherwise (one CPU per node).
    `time_limit` is in any form salloc takes ("30", "2:00:00", "1-00:00:00").
    The job id is on stderr: see parse_salloc_job_id.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    check_text("job name", job_name)
    argv = ["salloc", "--no-shell", "-N", str(nodes), "-J", job_name]
    if no_kill:
        argv.append("--no-kill")
    if exclusive:
        argv.append("--exclusive")
    if partition:
        check_text("partition", partition)
        argv.append(f"--partition={partition}")
    if account:
        check_text("account", account)
        argv.append(f"--account={account}")
    if time_limit:
        check_text("time limit", time_limit)
        argv.append(f"--time={time_limit}")
    argv.extend(extra)
    return argv


def parse_salloc_job_id(stderr: str) -> str | None:
    """The job id from salloc's `salloc: Granted job allocation 12`, or None if not granted."""
    found = _GRANTED_RE.findall(stderr)
    return found[-1] if found else None


def parse_salloc_pending_job_id(stderr: str) -> str | None:
    """The job id from `salloc: Pending job allocation 12` (printed while the job waits).

    Lets a caller cancel (`scancel 12`) an allocation that it no longer wants to wait for;
    salloc then exits 1 with `Job has been cancelled`.
    """
    found = _PENDING_RE.findall(stderr)
    return found[-1] if found else None


# --- sbatch ------------------------------------------------------------------------------------


def sbatch_argv(script: PurePath | str) -> list[str]:
    """`sbatch --parsable <script>`: submit; the job id is on stdout (parse_sbatch_job_id).

    Not idempotent: a retry after a timeout may submit the job twice.
    """
    check_text("script path", str(script))
    return ["sbatch", "--parsable", str(script)]


def parse_sbatch_job_id(stdout: str) -> str:
    """The job id from `sbatch --parsable`, which prints `JOB` or `JOB;CLUSTER`."""
    return stdout.strip().split(";")[0]


# --- scancel -----------------------------------------------------------------------------------


def scancel_step_argv(job_id: str, step_id: str, signal: str | int) -> list[str]:
    """`scancel --ctld --signal=<SIG> --full <job>.<step>`: signal one step's tasks.

    `signal` is a name ("TERM", "SIGTERM") or a number. The step keeps running if its tasks
    ignore the signal; only KILL (or a plain `scancel J.S`, which also SIGKILLs at once) ends
    it for sure. `--ctld` makes the exit status mean something (see the module docstring).
    """
    return scancel_steps_argv(job_id, [step_id], signal)


def scancel_steps_argv(job_id: str, step_ids: Sequence[str], signal: str | int) -> list[str]:
    """`scancel --ctld --signal=<SIG> --full <job>.<step> ...`: signal several steps at once.

    Step ids are "3" or "12.3" (already qualified with this job), as in scancel_step_argv.
    """
    check_text("job id", job_id)
    if not step_ids:
        raise ValueError("no step to signal")
    steps = []
    for step_id in step_ids:
        check_text("step id", step_id)
        steps.append(step_id if step_id.startswith(f"{job_id}.") else f"{job_id}.{step_id}")
    return ["scancel", "--ctld", f"--signal={_signal_name(signal)}", "--full", *steps]


def scancel_cancel_steps_argv(job_id: str, step_ids: Sequence[str]) -> list[str]:
    """`scancel --ctld <job>.<step> ...`: cancel steps (no `--signal`): slurmctld marks them
    cancelled and has their nodes kill them, retrying a node that does not answer yet."""
    return [
        a
        for a in scancel_steps_argv(job_id, step_ids, "KILL")
        if not a.startswith("--") or a == "--ctld"
    ]


def scancel_job_argv(job_id: str) -> list[str]:
    """`scancel <job>`: end the allocation (tasks get SIGCONT+SIGTERM, SIGKILL KillWait later)."""
    check_text("job id", job_id)
    return ["scancel", job_id]


def _signal_name(signal: str | int) -> str:
    if isinstance(signal, int):
        if signal < 1:
            raise ValueError(f"invalid signal number {signal}")
        return str(signal)
    name = signal.strip().upper()
    name = name.removeprefix("SIG")
    if not _SIGNAL_RE.fullmatch(name):
        raise ValueError(f"invalid signal {signal!r}")
    return name


# --- squeue ------------------------------------------------------------------------------------


def squeue_steps_argv(job_id: str) -> list[str]:
    """`squeue --steps --noheader -j <job> --Format=...`; parse with parse_squeue_steps."""
    check_text("job id", job_id)
    return ["squeue", "--steps", "--noheader", "-j", job_id, f"--Format={SQUEUE_STEP_FORMAT}"]


def squeue_nodes_argv(job_id: str) -> list[str]:
    """`squeue -h -j <job> -o %N`: the job's nodes as one hostlist (parse_squeue_nodes)."""
    return _squeue_job(job_id, "%N")


def parse_squeue_nodes(text: str) -> str:
    """The hostlist expression (e.g. `node[1-3]`) squeue_nodes_argv printed."""
    return text.strip()


def squeue_end_time_argv(job_id: str) -> list[str]:
    """`squeue -h -j <job> -o %e`: when the job's time limit ends (parse_end_time)."""
    return _squeue_job(job_id, "%e")


def parse_end_time(text: str) -> float | None:
    """`squeue -o %e` → epoch seconds; None for UNLIMITED, N/A or anything unparsable."""
    value = text.strip().splitlines()[0].strip() if text.strip() else ""
    try:
        # squeue prints the controller's local time without a zone.
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def squeue_state_argv(job_id: str) -> list[str]:
    """`squeue -h -j <job> -o %T`: the job's state, e.g. RUNNING (parse_job_running)."""
    return _squeue_job(job_id, "%T")


def parse_job_running(text: str) -> bool:
    """True when squeue_state_argv printed RUNNING (a job squeue no longer lists is not)."""
    return "RUNNING" in text.split()


def _squeue_job(job_id: str, field: str) -> list[str]:
    check_text("job id", job_id)
    return ["squeue", "-h", "-j", job_id, "-o", field]


def parse_squeue_steps(text: str) -> list[StepRow]:
    """Parse squeue_steps_argv's output. A header line (STEPID|...) and blank lines are skipped.

    A step whose srun client is gone stays listed until slurmctld hears that it ended; on a
    dead node that is until the node comes back, so this list is not proof a step runs.
    """
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("STEPID|"):
            continue
        fields = line.split("|", 3)
        if len(fields) != 4 or "." not in fields[0]:
            raise ValueError(f"unexpected squeue --steps line: {line!r}")
        full_id, state, nodes, name = fields
        job_id, _, step_id = full_id.partition(".")
        rows.append(StepRow(step_id=step_id, name=name, nodes=nodes, state=state, job_id=job_id))
    return rows


# --- scontrol ----------------------------------------------------------------------------------


def scontrol_show_node_argv(nodes: Sequence[str] | None = None) -> list[str]:
    """`scontrol --oneliner show node [n1,n2,...]`: one line per node (all nodes when None).

    Several names must be joined by commas: `show node n1 n2` is an error in 22.05.
    """
    argv = ["scontrol", "--oneliner", "show", "node"]
    if nodes is None:
        return argv
    if not nodes:
        raise ValueError("empty node list (pass None for all nodes)")
    for name in nodes:
        if not name or "," in name:
            raise ValueError(f"invalid node name {name!r}")
        check_text("node", name)
    return [*argv, ",".join(nodes)]


def parse_scontrol_nodes(text: str) -> dict[str, NodeRow]:
    """Parse `scontrol --oneliner show node` into {name: NodeRow}.

    Only the first NodeName=, NodeAddr= and State= of a line count, so a Reason= text (always
    last, free text with spaces) cannot fool it. Lines without NodeName= (such as
    `Node nosuch not found`) are skipped.
    """
    rows: dict[str, NodeRow] = {}
    for line in text.splitlines():
        fields = {key: rx.search(line) for key, rx in _NODE_FIELD_RES.items()}
        name = fields["NodeName"]
        if name is None or not name.group(1):
            continue
        addr = fields["NodeAddr"]
        state = fields["State"]
        reason = _REASON_RE.search(line)
        cpus = fields["CPUTot"]
        rows[name.group(1)] = NodeRow(
            name=name.group(1),
            addr=addr.group(1) if addr else "",
            state=state.group(1) if state else "",
            reason=reason.group(1).strip() if reason else "",
            cpus=int(cpus.group(1)) if cpus and cpus.group(1).isdigit() else None,
        )
    return rows


def node_is_down(state: str) -> bool:
    """True when a node in `state` cannot (or soon will not) run steps.

    Accepts scontrol's form (DOWN+NOT_RESPONDING, IDLE+DRAIN, ALLOCATED+DRAIN, MIXED) and
    sinfo's (down*, drained, draining, idle*): a trailing `*` means not responding.
    """
    state = state.strip()
    if state.endswith("*"):
        return True
    return any(word in _DOWN_STATE_WORDS for word in state.upper().split("+"))


def scontrol_show_hostnames_argv(hostlist: str) -> list[str]:
    """`scontrol show hostnames <hostlist>`: expand e.g. node[1-3,7] to one name per line."""
    check_text("hostlist", hostlist)
    return ["scontrol", "show", "hostnames", hostlist]


def parse_hostnames(text: str) -> list[str]:
    """Parse `scontrol show hostnames` output: one node name per line, in order."""
    return [line.strip() for line in text.splitlines() if line.strip()]
