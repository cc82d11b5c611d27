"""Tests of srtr.backends.slurm.cmd: argv builders and parsers of SLURM command output.

The fixtures below were captured from SLURM 22.05.8 (Debian bookworm) on the local test cluster
of scripts/slurm-cluster; only the names in them matter, the timestamps are whatever they were.
The last test runs the built srun command lines on that cluster (started when it is down).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from srtr.backends.slurm.cmd import (
    SQUEUE_STEP_FORMAT,
    NodeRow,
    StepRow,
    agents_srun_argv,
    node_is_down,
    parse_end_time,
    parse_hostnames,
    parse_job_running,
    parse_pyxis,
    parse_salloc_job_id,
    parse_salloc_pending_job_id,
    parse_sbatch_job_id,
    parse_scontrol_nodes,
    parse_squeue_nodes,
    parse_squeue_steps,
    parse_srun_node_failure,
    salloc_argv,
    sbatch_argv,
    scancel_job_argv,
    scancel_step_argv,
    scancel_steps_argv,
    scontrol_show_hostnames_argv,
    scontrol_show_node_argv,
    squeue_end_time_argv,
    squeue_nodes_argv,
    squeue_state_argv,
    squeue_steps_argv,
    srun_argv,
    srun_client_env,
    srun_help_argv,
    steers_srun,
)
from tests.support.e2e_util import wait_for

# --- fixtures captured from SLURM 22.05.8 on this machine ------------------------------------

# `salloc --no-shell -N2 -J srtr-demo` (stdout was empty, exit 0)
SALLOC_GRANTED = "salloc: Granted job allocation 1\n"
# the same while another job held the nodes; exit 0 once granted
SALLOC_PENDING_THEN_GRANTED = """\
salloc: Pending job allocation 2
salloc: job 2 queued and waiting for resources
salloc: job 2 has been allocated resources
salloc: Granted job allocation 2
"""
# pending, then `scancel 3` from elsewhere; exit 1
SALLOC_CANCELLED = """\
salloc: Pending job allocation 3
salloc: job 3 queued and waiting for resources
salloc: Job has been cancelled
salloc: error: Job submit/allocate failed: Job/step already completing or completed
"""
# `salloc --no-shell -N1 -J x -p nosuch`; exit 1
SALLOC_BAD_PARTITION = """\
salloc: error: invalid partition specified: nosuch
salloc: error: Job submit/allocate failed: Invalid partition name specified
"""
# `salloc --no-shell -N9 -J x` on 4 nodes: it does NOT fail, it waits forever
SALLOC_TOO_MANY_NODES = """\
salloc: Requested partition configuration not available now
salloc: Pending job allocation 4
salloc: job 4 queued and waiting for resources
"""

# `squeue --steps -j 7 -h -O 'StepId:|,StepState:|,Nodes:|,StepName:'` with four steps, two of
# them named "web" and one named "db|primary"
SQUEUE_STEPS = """\
7.0|RUNNING|node2|db|primary
7.1|RUNNING|node3|cache, with spaces
7.2|RUNNING|node1|web
7.3|RUNNING|node1|web
"""
# the same format with the header, a two-node step and a non-ASCII name
SQUEUE_STEPS_WITH_HEADER = """\
STEPID|STATE|NODELIST|NAME
12.0|RUNNING|node[1-2]|two
12.1|RUNNING|node3|ünï code
"""

# `squeue -h -j 1 -o %N`, `-o %e` and `-o %T` of a two-node job from `salloc --time=30`
SQUEUE_JOB_NODES = "node[1-2]\n"
SQUEUE_JOB_END = "2026-12-01T12:28:23\n"
SQUEUE_JOB_STATE = "RUNNING\n"
# `-o %e` of a job without a time limit; `-o %T` (exit 0) of a job just cancelled
SQUEUE_JOB_END_UNLIMITED = "NONE\n"
SQUEUE_JOB_STATE_ENDED = ""
# `sbatch --parsable job.sh` (exit 0); with a federation or cluster it prints `JOB;CLUSTER`
SBATCH_PARSABLE = "2\n"

# `scontrol --oneliner show node` with node3's slurmd killed ~20 s before and node4 drained
# by `scontrol update nodename=node4 state=drain reason='srtr test: drained, with spaces
# State=FAKE'`.
SCONTROL_NODES = """\
NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=0.60 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.2 NodeHostName=localhost Port=17001 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=23300 Sockets=2 Boards=1 State=ALLOCATED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-11-30T02:17:10 SlurmdStartTime=2026-11-30T02:51:48 LastBusyTime=2026-11-30T03:12:09 CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES=cpu=2,mem=2000M,billing=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=0.60 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.3 NodeHostName=localhost Port=17002 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=23300 Sockets=2 Boards=1 State=ALLOCATED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-11-30T02:17:10 SlurmdStartTime=2026-11-30T02:51:49 LastBusyTime=2026-11-30T03:12:09 CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES=cpu=2,mem=2000M,billing=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node3 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.64 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.4 NodeHostName=localhost Port=17003 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=23328 Sockets=2 Boards=1 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-11-30T02:17:10 SlurmdStartTime=2026-11-30T02:51:49 LastBusyTime=2026-11-30T03:12:09 CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=Not responding [root@2026-11-30T03:12:29]
NodeName=node4 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.60 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.5 NodeHostName=localhost Port=17004 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=23300 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-11-30T02:17:10 SlurmdStartTime=2026-11-30T02:51:49 LastBusyTime=2026-11-30T03:12:09 CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=srtr test: drained, with spaces State=FAKE [root@2026-11-30T03:12:12]
"""  # noqa: E501
# node3 ~11 s after its slurmd was killed (before DOWN); node1 drained while allocated
SCONTROL_NODE3_NOT_RESPONDING = """\
NodeName=node3 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=0.64 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.4 NodeHostName=localhost Port=17003 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=23328 Sockets=2 Boards=1 State=ALLOCATED+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-11-30T02:17:10 SlurmdStartTime=2026-11-30T02:51:49 LastBusyTime=2026-11-30T03:12:09 CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES=cpu=2,mem=2000M,billing=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
"""  # noqa: E501
SCONTROL_NODE1_ALLOCATED_DRAIN = """\
NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=0.60 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.2 NodeHostName=localhost Port=17001 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=23219 Sockets=2 Boards=1 State=ALLOCATED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-11-30T02:17:10 SlurmdStartTime=2026-11-30T02:51:48 LastBusyTime=2026-11-30T03:12:09 CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES=cpu=2,mem=2000M,billing=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=maint [root@2026-11-30T03:12:42]
"""  # noqa: E501
# `scontrol --oneliner show node nosuch` (exit 1; the message is on stdout)
SCONTROL_NO_SUCH_NODE = "Node nosuch not found\n"

# `scontrol show hostnames 'node[1-3,7],node10'`
HOSTNAMES = "node1\nnode2\nnode3\nnode7\nnode10\n"

# stderr of the srun client of a step on node3 when node3's slurmd was killed (exit code 0!)
SRUN_NODE_FAILURE = "srun: error: Node failure on node3\n"
# stderr of a srun client whose task exited 3 / whose step was cancelled with its job
SRUN_EXIT_3 = "srun: error: node2: task 0: Exited with exit code 3\n"
SRUN_JOB_CANCELLED = """\
slurmstepd-node3: error: *** STEP 12.1 ON node3 CANCELLED AT 2026-11-30T03:14:31 ***
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
srun: error: node3: task 0: Terminated
"""

# A value that `srun --export=ALL,K=V` cannot carry: commas, spaces, both quotes, `$`,
# backquotes, a backslash, `%`, `=` and a newline.
NASTY = "a,b c=\"q\" 's' $HOME `x` \\ %j =x\nline2"


# --- salloc ------------------------------------------------------------------------------------


def test_salloc_argv_minimal() -> None:
    assert salloc_argv(nodes=4, job_name="srtr-demo") == [
        "salloc",
        "--no-shell",
        "-N",
        "4",
        "-J",
        "srtr-demo",
        "--no-kill",
        "--exclusive",
    ]


def test_salloc_argv_all_options() -> None:
    argv = salloc_argv(
        nodes=2,
        job_name="j",
        partition="gpu",
        account="proj1",
        time_limit="1-00:00:00",
        no_kill=False,
        exclusive=False,
        extra=("--immediate=30",),
    )
    assert argv == [
        "salloc",
        "--no-shell",
        "-N",
        "2",
        "-J",
        "j",
        "--partition=gpu",
        "--account=proj1",
        "--time=1-00:00:00",
        "--immediate=30",
    ]


def test_salloc_argv_none_and_empty_options_are_left_out() -> None:
    argv = salloc_argv(nodes=1, job_name="j", partition=None, account="", time_limit=None)
    assert not any(a.startswith(("--partition", "--account", "--time")) for a in argv)


@pytest.mark.parametrize("nodes", [0, -1])
def test_salloc_argv_rejects_no_nodes(nodes: int) -> None:
    with pytest.raises(ValueError):
        salloc_argv(nodes=nodes, job_name="j")


def test_salloc_argv_rejects_a_multiline_name() -> None:
    with pytest.raises(ValueError):
        salloc_argv(nodes=1, job_name="a\nb")


def test_parse_salloc_job_id() -> None:
    assert parse_salloc_job_id(SALLOC_GRANTED) == "1"
    assert parse_salloc_job_id(SALLOC_PENDING_THEN_GRANTED) == "2"
    assert parse_salloc_job_id(SALLOC_CANCELLED) is None
    assert parse_salloc_job_id(SALLOC_BAD_PARTITION) is None
    assert parse_salloc_job_id(SALLOC_TOO_MANY_NODES) is None
    assert parse_salloc_job_id("") is None


def test_parse_salloc_pending_job_id() -> None:
    assert parse_salloc_pending_job_id(SALLOC_PENDING_THEN_GRANTED) == "2"
    assert parse_salloc_pending_job_id(SALLOC_TOO_MANY_NODES) == "4"
    assert parse_salloc_pending_job_id(SALLOC_GRANTED) is None


# --- srun --------------------------------------------------------------------------------------

BASE = [
    "srun",
    "--jobid",
    "12",
    "--overlap",
    "-N1",
    "-n1",
    "-w",
    "node3",
    "--job-name=web-0",
    "--output=/run/logs/web-0.log",
    "--open-mode=append",
    "--input=none",
    "--export=ALL",
]


def _srun(**kwargs: object) -> list[str]:
    args: dict[str, object] = {
        "job_id": "12",
        "node": "node3",
        "step_name": "web-0",
        "log_path": Path("/run/logs/web-0.log"),
        "env": {},
        "argv": ["server", "--port", "80"],
    }
    args.update(kwargs)
    return srun_argv(**args)  # type: ignore[arg-type]


def _command_part(argv: list[str]) -> list[str]:
    """The part that runs on the node: from the `env --` prefix on."""
    i = argv.index("env")
    assert argv[i + 1] == "--"
    return argv[i:]


def test_srun_argv_plain_keeps_the_environment_off_the_command_line() -> None:
    assert _srun(env={"A": "1", "HF_TOKEN": "hf_secret"}) == [
        *BASE,
        "env",
        "--",
        "server",
        "--port",
        "80",
    ]


def test_srun_argv_empty_env_still_goes_through_env() -> None:
    # `env` makes a missing command exit 127 (srun alone: 2), so it is always there.
    assert _srun()[len(BASE) :] == ["env", "--", "server", "--port", "80"]


def test_only_variables_that_steer_srun_go_on_the_command_line() -> None:
    env = {"LD_LIBRARY_PATH": "/cuda", "PATH": "/opt/bin", "SLURM_X": "1", "TOKEN": "s3cret"}
    assert _command_part(_srun(env=env)) == [
        "env",
        "--",
        "LD_LIBRARY_PATH=/cuda",
        "PATH=/opt/bin",
        "SLURM_X=1",
        "server",
        "--port",
        "80",
    ]
    assert not any("s3cret" in a for a in _srun(env=env))


@pytest.mark.parametrize(
    ("name", "steers"),
    [
        ("PATH", True),
        ("LD_PRELOAD", True),
        ("SLURM_CPUS_PER_TASK", True),
        ("SLURMD_DEBUG", True),
        ("SRUN_CPUS_PER_TASK", True),
        ("PMI_FANOUT", True),
        ("GLIBC_TUNABLES", True),
        ("HF_TOKEN", False),
        ("PYTHONPATH", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("MYPATH", False),
    ],
)
def test_steers_srun(name: str, steers: bool) -> None:
    assert steers_srun(name) is steers


def test_srun_client_env_carries_the_instance_env_and_drops_an_enclosing_step() -> None:
    base = {"PATH": "/usr/bin", "SLURM_CONF": "/c", "SLURM_JOB_ID": "7", "SRUN_X": "1", "H": "h"}
    env = {"NASTY": NASTY, "EMPTY": "", "PATH": "/opt/bin", "H": "mine"}
    assert srun_client_env(base, env) == {
        "PATH": "/usr/bin",  # srun is found with the controller's PATH; the task's is in argv
        "SLURM_CONF": "/c",
        "H": "mine",
        "NASTY": NASTY,
        "EMPTY": "",
    }


@pytest.mark.parametrize("env", [{"A=B": "1"}, {"": "1"}, {"A": "nul\0"}])
def test_srun_client_env_rejects_what_cannot_be_passed(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        srun_client_env({}, env)


def test_srun_argv_preamble() -> None:
    cmd = _command_part(_srun(env={"A": "1"}, preamble="source /etc/profile\nulimit -n 4096"))
    assert cmd == [
        "env",
        "--",
        "bash",
        "-c",
        'source /etc/profile\nulimit -n 4096\nexec "$@"',
        "srtr-web-0",
        "server",
        "--port",
        "80",
    ]


def test_srun_argv_shell() -> None:
    cmd = _command_part(_srun(argv=["echo $A | wc -c"], shell=True))
    assert cmd == ["env", "--", "bash", "-c", "echo $A | wc -c"]


def test_srun_argv_shell_with_preamble_joins_them_like_the_local_backend() -> None:
    cmd = _command_part(_srun(argv=["run-bench"], shell=True, preamble="cd /data"))
    assert cmd == ["env", "--", "bash", "-c", "cd /data\nrun-bench"]


@pytest.mark.parametrize("argv", [[], ["a", "b"]])
def test_srun_argv_shell_needs_exactly_one_command_line(argv: list[str]) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        _srun(argv=argv, shell=True)


def test_srun_argv_rejects_an_empty_argv() -> None:
    with pytest.raises(ValueError, match="empty argv"):
        _srun(argv=[])


def test_srun_argv_command_with_an_equals_sign_is_not_taken_for_a_variable() -> None:
    cmd = _command_part(_srun(argv=["/opt/a=b/bin/run", "x"]))
    assert cmd == ["env", "--", "bash", "-c", 'exec "$@"', "srtr-web-0", "/opt/a=b/bin/run", "x"]


def test_srun_argv_container_with_pyxis() -> None:
    argv = _srun(container="nvcr.io/nvidia/pytorch:24.01-py3", pyxis=True)
    assert argv[len(BASE)] == "--container-image=nvcr.io/nvidia/pytorch:24.01-py3"
    assert _command_part(argv) == ["env", "--", "server", "--port", "80"]


def test_srun_argv_container_without_pyxis_is_dropped() -> None:
    assert _srun(container="img:1", pyxis=False) == _srun()


def test_srun_argv_cpus_bind_and_options_come_before_the_command() -> None:
    argv = _srun(
        cpus_per_task=8,
        cpu_bind="cores",
        srun_options={"mem": "0", "--gres": "gpu:1", "exact": "", "c": "4"},
    )
    assert argv[len(BASE) : argv.index("env")] == [
        "--cpus-per-task=8",
        "--cpu-bind=cores",
        "--mem=0",
        "--gres=gpu:1",
        "--exact",
        "-c4",
    ]


def test_srun_argv_cwd() -> None:
    argv = _srun(cwd=Path("/work/dir"))
    assert argv[len(BASE)] == "--chdir=/work/dir"


@pytest.mark.parametrize("cpus", [0, -2])
def test_srun_argv_rejects_nonpositive_cpus(cpus: int) -> None:
    with pytest.raises(ValueError):
        _srun(cpus_per_task=cpus)


@pytest.mark.parametrize(
    "key", ["output", "--output", "out", "o", "export", "exp", "jobid", "job", "w", "overlap"]
)
def test_srun_argv_options_may_not_replace_what_srtr_sets(key: str) -> None:
    with pytest.raises(ValueError, match="cannot be overridden"):
        _srun(srun_options={key: "x"})


@pytest.mark.parametrize("key", ["", "--", "a b", "x=y", "-"])
def test_srun_argv_rejects_bad_option_names(key: str) -> None:
    with pytest.raises(ValueError, match="invalid srun option"):
        _srun(srun_options={key: "1"})


def test_srun_argv_escapes_percent_in_the_log_path() -> None:
    # srun expands %j, %N, ... in --output; %% is a literal % (checked on the cluster).
    argv = _srun(log_path="/runs/50% done/%j.log")
    assert "--output=/runs/50%% done/%%j.log" in argv


@pytest.mark.parametrize("path", ["relative.log", "3", "/a\\b.log", "/a\nb.log"])
def test_srun_argv_rejects_log_paths_srun_would_change(path: str) -> None:
    with pytest.raises(ValueError):
        _srun(log_path=path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"env": {"A=B": "1"}},
        {"env": {"": "1"}},
        {"env": {"A": "nul\0"}},
        {"step_name": "two\nlines"},
        {"step_name": ""},
        {"node": ""},
        {"argv": ["a\0b"]},
    ],
)
def test_srun_argv_rejects_what_cannot_be_passed(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _srun(**kwargs)


def test_the_node_part_delivers_the_environment_intact(tmp_path: Path) -> None:
    """Run what slurmstepd would run (the `env ...` part) in the client's environment, as
    `--export=ALL` hands it to the task: every value arrives as is."""
    env = {"NASTY": NASTY, "EMPTY": "", "W": "ALL,NONE", "ÜNI": "ü", "LD_X": "a b"}
    dump = [sys.executable, "-c", _DUMP_ENV, *env]
    for extra in ({}, {"preamble": 'export PRE="$W"'}):
        cmd = _command_part(_srun(env=env, argv=dump, **extra))
        client = srun_client_env(os.environ, env)
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=client)
        assert json.loads(out.stdout) == env


def test_the_node_part_reports_a_missing_command_as_127() -> None:
    for argv in (["/nonexistent/srtr-test"], ["/nonexistent/a=b"]):
        cmd = _command_part(_srun(argv=argv))
        assert subprocess.run(cmd, capture_output=True).returncode == 127


_DUMP_ENV = "import json, os, sys; print(json.dumps({k: os.environ[k] for k in sys.argv[1:]}))"


def test_parse_srun_node_failure() -> None:
    assert parse_srun_node_failure(SRUN_NODE_FAILURE) == "node3"
    assert parse_srun_node_failure(SRUN_EXIT_3) is None
    assert parse_srun_node_failure(SRUN_JOB_CANCELLED) is None
    assert parse_srun_node_failure("") is None


# --- scancel -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "spelled"),
    [("TERM", "TERM"), ("SIGTERM", "TERM"), ("sigkill", "KILL"), ("USR1", "USR1"), (15, "15")],
)
def test_scancel_step_argv(signal: str | int, spelled: str) -> None:
    assert scancel_step_argv("12", "3", signal) == [
        "scancel",
        "--ctld",
        f"--signal={spelled}",
        "--full",
        "12.3",
    ]


def test_scancel_step_argv_accepts_a_full_step_id() -> None:
    assert scancel_step_argv("12", "12.3", "TERM")[-1] == "12.3"


@pytest.mark.parametrize("signal", ["", "TERM;rm", "SIG", 0, -9])
def test_scancel_step_argv_rejects_bad_signals(signal: str | int) -> None:
    with pytest.raises(ValueError):
        scancel_step_argv("12", "3", signal)


def test_scancel_job_argv() -> None:
    assert scancel_job_argv("12") == ["scancel", "12"]


def test_scancel_steps_argv_signals_several_steps_in_one_call() -> None:
    assert scancel_steps_argv("12", ["3", "12.4", "extern"], "KILL") == [
        "scancel",
        "--ctld",
        "--signal=KILL",
        "--full",
        "12.3",
        "12.4",
        "12.extern",
    ]


@pytest.mark.parametrize(
    ("job", "steps"), [("12", []), ("12", [""]), ("12", ["3\n4"]), ("", ["3"])]
)
def test_scancel_steps_argv_rejects_bad_ids(job: str, steps: list[str]) -> None:
    with pytest.raises(ValueError):
        scancel_steps_argv(job, steps, "KILL")


# --- squeue ------------------------------------------------------------------------------------


def test_squeue_steps_argv() -> None:
    assert squeue_steps_argv("7") == [
        "squeue",
        "--steps",
        "--noheader",
        "-j",
        "7",
        "--Format=StepId:|,StepState:|,Nodes:|,StepName:",
    ]
    assert SQUEUE_STEP_FORMAT.endswith("StepName:")  # the name, which may hold "|", goes last


def test_parse_squeue_steps() -> None:
    assert parse_squeue_steps(SQUEUE_STEPS) == [
        StepRow("0", "db|primary", "node2", "RUNNING", "7"),
        StepRow("1", "cache, with spaces", "node3", "RUNNING", "7"),
        StepRow("2", "web", "node1", "RUNNING", "7"),
        StepRow("3", "web", "node1", "RUNNING", "7"),
    ]


def test_parse_squeue_steps_skips_the_header_and_keeps_hostlists() -> None:
    rows = parse_squeue_steps(SQUEUE_STEPS_WITH_HEADER)
    assert rows == [
        StepRow("0", "two", "node[1-2]", "RUNNING", "12"),
        StepRow("1", "ünï code", "node3", "RUNNING", "12"),
    ]
    assert rows[1].full_id == "12.1"


def test_parse_squeue_steps_empty() -> None:
    # squeue prints nothing (exit 0) for a job that has no steps or does not exist at all.
    assert parse_squeue_steps("") == []
    assert parse_squeue_steps("\n") == []


def test_parse_squeue_steps_named_steps_like_extern() -> None:
    # Clusters with PrologFlags=contain list an "extern" step; this one does not.
    assert parse_squeue_steps("9.extern|RUNNING|node1|extern\n") == [
        StepRow("extern", "extern", "node1", "RUNNING", "9")
    ]


@pytest.mark.parametrize("line", ["7.0|RUNNING|node2", "garbage", "70|RUNNING|node2|x"])
def test_parse_squeue_steps_rejects_other_formats(line: str) -> None:
    with pytest.raises(ValueError):
        parse_squeue_steps(line)


def test_squeue_job_field_argvs() -> None:
    assert squeue_nodes_argv("7") == ["squeue", "-h", "-j", "7", "-o", "%N"]
    assert squeue_end_time_argv("7") == ["squeue", "-h", "-j", "7", "-o", "%e"]
    assert squeue_state_argv("7") == ["squeue", "-h", "-j", "7", "-o", "%T"]


@pytest.mark.parametrize("build", [squeue_nodes_argv, squeue_end_time_argv, squeue_state_argv])
@pytest.mark.parametrize("job", ["", "7\n8"])
def test_squeue_job_field_argvs_reject_bad_job_ids(build: Any, job: str) -> None:
    with pytest.raises(ValueError):
        build(job)


def test_parse_squeue_nodes() -> None:
    assert parse_squeue_nodes(SQUEUE_JOB_NODES) == "node[1-2]"


def test_parse_end_time() -> None:
    expected = datetime.datetime(2026, 12, 1, 12, 28, 23).timestamp()  # the controller's zone
    assert parse_end_time(SQUEUE_JOB_END) == expected


@pytest.mark.parametrize("text", [SQUEUE_JOB_END_UNLIMITED, "UNLIMITED\n", "N/A\n", "", "\n"])
def test_parse_end_time_without_a_limit(text: str) -> None:
    assert parse_end_time(text) is None


def test_parse_job_running() -> None:
    assert parse_job_running(SQUEUE_JOB_STATE)
    assert not parse_job_running(SQUEUE_JOB_STATE_ENDED)
    assert not parse_job_running("PENDING\n")
    assert not parse_job_running("COMPLETING\n")


# --- sbatch ------------------------------------------------------------------------------------


def test_sbatch_argv() -> None:
    assert sbatch_argv(Path("/runs/x/submit.sh")) == ["sbatch", "--parsable", "/runs/x/submit.sh"]


@pytest.mark.parametrize("path", ["", "/a\nb.sh"])
def test_sbatch_argv_rejects_bad_paths(path: str) -> None:
    with pytest.raises(ValueError):
        sbatch_argv(path)


@pytest.mark.parametrize(("text", "job"), [(SBATCH_PARSABLE, "2"), ("17;cluster1\n", "17")])
def test_parse_sbatch_job_id(text: str, job: str) -> None:
    assert parse_sbatch_job_id(text) == job


# --- srun --help -------------------------------------------------------------------------------


def test_pyxis_is_seen_in_srun_help() -> None:
    assert srun_help_argv() == ["srun", "--help"]
    assert parse_pyxis("      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n")
    assert not parse_pyxis("Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]\n")


# --- scontrol ----------------------------------------------------------------------------------


def test_scontrol_show_node_argv() -> None:
    assert scontrol_show_node_argv(None) == ["scontrol", "--oneliner", "show", "node"]
    # `scontrol show node node2 node4` fails ("too many arguments"); commas work.
    assert scontrol_show_node_argv(["node2", "node4"]) == [
        "scontrol",
        "--oneliner",
        "show",
        "node",
        "node2,node4",
    ]


@pytest.mark.parametrize("nodes", [[], [""], ["a,b"], ["x\ny"]])
def test_scontrol_show_node_argv_rejects_bad_lists(nodes: list[str]) -> None:
    with pytest.raises(ValueError):
        scontrol_show_node_argv(nodes)


def test_parse_scontrol_nodes() -> None:
    rows = parse_scontrol_nodes(SCONTROL_NODES)
    assert list(rows) == ["node1", "node2", "node3", "node4"]
    assert rows["node1"] == NodeRow("node1", "127.0.0.2", "ALLOCATED", "", cpus=2)
    assert rows["node2"].addr == "127.0.0.3"
    assert rows["node3"] == NodeRow(
        "node3",
        "127.0.0.4",
        "DOWN+NOT_RESPONDING",
        "Not responding [root@2026-11-30T03:12:29]",
        cpus=2,
    )
    # The free-text reason mentions State=FAKE; the real State= comes first and wins.
    assert rows["node4"].state == "IDLE+DRAIN"
    assert (
        rows["node4"].reason
        == "srtr test: drained, with spaces State=FAKE [root@2026-11-30T03:12:12]"
    )
    assert [r.down for r in rows.values()] == [False, False, True, True]


def test_parse_scontrol_nodes_transient_states() -> None:
    node3 = parse_scontrol_nodes(SCONTROL_NODE3_NOT_RESPONDING)["node3"]
    assert (node3.state, node3.down) == ("ALLOCATED+NOT_RESPONDING", True)
    node1 = parse_scontrol_nodes(SCONTROL_NODE1_ALLOCATED_DRAIN)["node1"]
    assert (node1.state, node1.reason, node1.down) == (
        "ALLOCATED+DRAIN",
        "maint [root@2026-11-30T03:12:42]",
        True,
    )


def test_agents_srun_argv_is_one_step_over_every_node() -> None:
    argv = agents_srun_argv(
        job_id="12",
        nodes=["node1", "node2", "node3"],
        step_name="srtr-agents",
        log_path="/run/logs/agents.out",
        command=["python3", "-m", "srtr.backends.agent.node", "--node-env", "SLURMD_NODENAME"],
        cpus_per_task=8,
    )
    assert argv == [
        "srun",
        "--jobid",
        "12",
        "--overlap",
        "--no-kill",
        "--kill-on-bad-exit=0",
        "-N",
        "3",
        "-n",
        "3",
        "--ntasks-per-node=1",
        "-w",
        "node1,node2,node3",
        "--job-name=srtr-agents",
        "--output=/run/logs/agents.out",
        "--open-mode=append",
        "--input=none",
        "--export=ALL",
        "--cpus-per-task=8",
        "--mem=0",
        "python3",
        "-m",
        "srtr.backends.agent.node",
        "--node-env",
        "SLURMD_NODENAME",
    ]


@pytest.mark.parametrize(
    "kwargs", [{"nodes": []}, {"nodes": ["a,b"]}, {"command": []}, {"command": ["a\0"]}]
)
def test_agents_srun_argv_rejects_what_cannot_be_passed(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {
        "job_id": "12",
        "nodes": ["node1"],
        "step_name": "srtr-agents",
        "log_path": "/run/logs/agents.out",
        "command": ["agent"],
    }
    with pytest.raises(ValueError):
        agents_srun_argv(**{**args, **kwargs})  # type: ignore[arg-type]


def test_parse_scontrol_nodes_skips_messages() -> None:
    assert parse_scontrol_nodes(SCONTROL_NO_SUCH_NODE) == {}
    assert parse_scontrol_nodes("") == {}


@pytest.mark.parametrize(
    ("state", "down"),
    [
        # scontrol spellings (seen here, except MIXED: select/linear allocates whole nodes)
        ("IDLE", False),
        ("ALLOCATED", False),
        ("MIXED", False),
        ("IDLE+COMPLETING", False),
        ("DOWN+NOT_RESPONDING", True),
        ("ALLOCATED+NOT_RESPONDING", True),
        ("IDLE+NOT_RESPONDING", True),  # briefly, after `scontrol update state=resume`
        ("IDLE+DRAIN", True),
        ("ALLOCATED+DRAIN", True),
        ("MIXED+DRAIN", True),
        ("DOWN", True),
        ("DOWN+DRAIN", True),
        ("MIXED+FAIL", True),
        ("IDLE+POWERED_DOWN", True),
        # sinfo %t / %T spellings
        ("idle", False),
        ("alloc", False),
        ("mix", False),
        ("down*", True),
        ("idle*", True),
        ("drain", True),
        ("drained", True),
        ("draining", True),
        ("fail", True),
        ("failing", True),
        ("", False),
    ],
)
def test_node_is_down(state: str, down: bool) -> None:
    assert node_is_down(state) is down


def test_hostnames() -> None:
    assert scontrol_show_hostnames_argv("node[1-3,7],node10") == [
        "scontrol",
        "show",
        "hostnames",
        "node[1-3,7],node10",
    ]
    assert parse_hostnames(HOSTNAMES) == ["node1", "node2", "node3", "node7", "node10"]
    assert parse_hostnames("") == []


# --- on the local SLURM test cluster (scripts/slurm-cluster up) -------------------------------


@pytest.mark.slurm
def test_srun_argv_on_the_cluster(tmp_path: Path, slurm_cluster: dict[str, str]) -> None:
    """Built command lines, run for real: env values, preamble, exit codes, the log file."""
    env = slurm_cluster
    alloc = subprocess.run(
        salloc_argv(nodes=1, job_name="srtr-pytest", time_limit="5", extra=("--immediate=30",)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    job = parse_salloc_job_id(alloc.stderr)
    assert job is not None, alloc.stderr
    try:
        node = parse_hostnames(
            subprocess.run(squeue_nodes_argv(job), env=env, capture_output=True, text=True).stdout
        )[0]
        log = tmp_path / "50% of %j.log"  # the % must survive srun's filename patterns
        values = {"NASTY": NASTY, "EMPTY": "", "W": "ALL,NONE"}
        dump = [sys.executable, "-c", _DUMP_ENV, *values]

        def run(**kwargs: object) -> subprocess.CompletedProcess[str]:
            args: dict[str, object] = {
                "job_id": job,
                "node": node,
                "step_name": "srtr-pytest",
                "log_path": log,
                "env": values,
                "argv": dump,
            }
            args.update(kwargs)
            argv = srun_argv(**args)  # type: ignore[arg-type]
            client = srun_client_env(env, args["env"])  # type: ignore[arg-type]
            return subprocess.run(argv, env=client, capture_output=True, text=True, timeout=60)

        assert run().returncode == 0
        assert run(preamble="echo from-preamble").returncode == 0
        assert run(argv=["exit 3"], shell=True).returncode == 3
        assert run(argv=["kill -TERM $$"], shell=True).returncode == 143
        assert run(argv=["/nonexistent/srtr-test"]).returncode == 127
        lines = log.read_text().splitlines()
        assert json.loads(lines[0]) == values
        assert lines[1] == "from-preamble"
        assert json.loads(lines[2]) == values
    finally:
        subprocess.run(scancel_job_argv(job), env=env, timeout=30)


@pytest.mark.slurm
def test_job_queries_scancel_and_sbatch_on_the_cluster(
    tmp_path: Path, slurm_cluster: dict[str, str]
) -> None:
    """squeue of one job, scancel of several steps, sbatch and srun --help, run for real."""

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=slurm_cluster, capture_output=True, text=True, timeout=60)

    alloc = run(salloc_argv(nodes=2, job_name="srtr-pytest-q", time_limit="5", extra=("-I30",)))
    job = parse_salloc_job_id(alloc.stderr)
    assert job is not None, alloc.stderr
    try:
        hostlist = parse_squeue_nodes(run(squeue_nodes_argv(job)).stdout)
        nodes = parse_hostnames(run(scontrol_show_hostnames_argv(hostlist)).stdout)
        assert len(nodes) == 2, hostlist
        assert parse_job_running(run(squeue_state_argv(job)).stdout)
        end = parse_end_time(run(squeue_end_time_argv(job)).stdout)
        assert end is not None and 0 < end - time.time() <= 5 * 60 + 5
        clients = [
            subprocess.Popen(
                srun_argv(
                    job_id=job,
                    node=node,
                    step_name=f"srtr-pytest-{node}",
                    log_path=tmp_path / f"{node}.log",
                    env={},
                    argv=["sleep", "300"],
                ),
                env=slurm_cluster,
                stdin=subprocess.DEVNULL,
            )
            for node in nodes
        ]

        def ours() -> list[str]:
            rows = parse_squeue_steps(run(squeue_steps_argv(job)).stdout)
            return [r.step_id for r in rows if r.name.startswith("srtr-pytest-")]

        wait_for(lambda: len(ours()) == 2, 60, "both steps to be listed")
        assert run(scancel_steps_argv(job, ours(), "KILL")).returncode == 0
        for client in clients:
            client.wait(timeout=60)
        wait_for(lambda: not ours(), 60, "both steps to be gone")
    finally:
        run(scancel_job_argv(job))

    def ended() -> bool:
        return not parse_job_running(run(squeue_state_argv(job)).stdout)

    wait_for(ended, 60, "the job to end")
    out = tmp_path / "batch.out"
    script = tmp_path / "batch.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --output={out}\necho batch-ran\n")
    submitted = run(sbatch_argv(script))
    assert submitted.returncode == 0, submitted.stderr
    assert parse_sbatch_job_id(submitted.stdout).isdigit()
    wait_for(lambda: out.exists() and "batch-ran" in out.read_text(), 60, "the batch job's output")
    assert not parse_pyxis(run(srun_help_argv()).stdout)  # the test cluster has no pyxis


def test_transient_slurm_errors_are_retried_then_reported(tmp_path: Path) -> None:
    from srtr.backends.slurm.backend import SlurmCommands, SlurmError

    counter = tmp_path / "count"
    flaky = tmp_path / "flaky"
    flaky.write_text(
        "#!/bin/bash\n"
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n"
        "if [ $n -lt 2 ]; then echo 'squeue: error: Socket timed out on send/recv' >&2; "
        "exit 1; fi\necho ok\n"
    )
    flaky.chmod(0o755)
    commands = SlurmCommands(attempts=5, max_wait=0.01)
    assert commands.run([str(flaky)]).stdout == "ok\n"
    assert counter.read_text().strip() == "3"
    counter.write_text("-100")
    with pytest.raises(SlurmError, match="kept failing"):
        SlurmCommands(attempts=3, max_wait=0.01).run([str(flaky)])
    hard = tmp_path / "hard"
    hard.write_text("#!/bin/bash\necho 'Invalid job id specified' >&2\nexit 1\n")
    hard.chmod(0o755)
    with pytest.raises(SlurmError, match="Invalid job id"):
        commands.run([str(hard)])


def test_a_command_that_is_not_idempotent_runs_once(tmp_path: Path) -> None:
    """sbatch after a timeout may have submitted already: `retry=False` never runs it twice."""
    from srtr.backends.slurm.backend import SlurmCommands, SlurmError

    counter = tmp_path / "count"
    flaky = tmp_path / "flaky"
    flaky.write_text(
        "#!/bin/bash\n"
        f"echo x >> {counter}\n"
        "echo 'sbatch: error: Socket timed out on send/recv operation' >&2\nexit 1\n"
    )
    flaky.chmod(0o755)
    with pytest.raises(SlurmError, match=r"flaky failed: sbatch: error: Socket timed out"):
        SlurmCommands(attempts=5, max_wait=0.01).run([str(flaky)], check=False, retry=False)
    assert counter.read_text() == "x\n"
