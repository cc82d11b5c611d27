"""The agent protocol: every message survives encode/decode, garbage is refused, and the
token proofs bind the role, the nonce and the node."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from srtr.backends.agent import protocol as p
from srtr.backends.base import LaunchSpec
from srtr.resources.objects import ProbeKind, ProbeSpec

NASTY = "a,b c'd\"e$f`g\\h%i=j\nk ü"

SPEC = LaunchSpec(
    name="service_web_node2",
    node="node2",
    node_ip="127.0.0.3",
    argv=("server", "--port", "80", NASTY),
    env={"HF_TOKEN": NASTY, "EMPTY": ""},
    log_path=Path("/run/logs/service_web_node2.out"),
    attempt=3,
    preamble="ulimit -n 4096",
    shell=False,
    cwd=Path("/work"),
)

MESSAGES: list[p.Message] = [
    p.Challenge("n1"),
    p.Hello(node="node2", pid=42, nonce="n2", proof="ab"),
    p.Welcome(proof="cd", heartbeat=0.5, lease=5.0),
    p.Launch(7, SPEC),
    p.Launch(7, replace(SPEC, memory_limit=512 * 1024 * 1024)),
    p.Launched(7, "x", 3, 1234, 99),
    p.Launched(7, "x", 3, 1234, None),
    p.LaunchFailed(7, "x", 3, "cannot start 'nope': [Errno 2] No such file"),
    p.Signal("x", 15),
    p.Exited("x", 3, 1234, 143, 15, "killed by SIGTERM"),
    p.Exited("x", 3, 1234, None, None, "exit status unknown"),
    p.Exited("x", 3, 1234, 137, 9, "killed by SIGKILL", "OOMKilled"),
    p.Probe(
        seq=8,
        name="x",
        attempt=3,
        probe=ProbeSpec(ProbeKind.HTTP, 60.0, 0.5, port=80, path="/health", status=200),
        node_ip="127.0.0.3",
        log_path="/run/logs/x.out",
        log_offset=17,
        files_dir="/run/logs",
    ),
    p.ProbeResult(8, False, "connection refused"),
    p.Shutdown("the job ended"),
    p.Bye(),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_round_trip(message: p.Message) -> None:
    line = p.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one message, one line
    assert p.decode(line) == message


def test_a_launch_carries_the_spec_without_its_srun_settings() -> None:
    spec = LaunchSpec(**{**SPEC.__dict__, "cpus_per_task": 4, "srun_options": {"mem": "0"}})
    decoded = p.decode(p.encode(p.Launch(1, spec)))
    assert isinstance(decoded, p.Launch)
    assert decoded.spec == SPEC


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"not json\n",
        b"[1, 2]\n",
        b'{"no": "type"}\n',
        b'{"type": "nosuch"}\n',
        b'{"type": "signal", "name": "x"}\n',
        b'{"type": "signal", "name": "x", "signum": 9, "extra": 1}\n',
        b'{"type": "launch", "seq": 1, "spec": {"name": "x"}}\n',
        b'{"type": "launch", "seq": 1, "spec": ' + p.encode(p.Launch(1, SPEC))[30:],
    ],
)
def test_garbage_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(line)


def test_an_env_value_that_is_not_a_string_is_refused() -> None:
    line = p.encode(p.Launch(1, SPEC)).replace(b'"EMPTY":""', b'"EMPTY":1')
    with pytest.raises(p.ProtocolError):
        p.decode(line)


def test_proofs_bind_token_role_nonce_and_node() -> None:
    token = "t0ken"
    good = p.proof(token, "agent", "n1", "node2")
    assert p.verify(token, "agent", "n1", "node2", good)
    assert not p.verify("other", "agent", "n1", "node2", good)
    assert not p.verify(token, "controller", "n1", "node2", good)  # no reflection
    assert not p.verify(token, "agent", "n2", "node2", good)  # no replay on a new nonce
    assert not p.verify(token, "agent", "n1", "node3", good)  # not for another node
    assert not p.verify(token, "agent", "n1", "node2", "")
    assert token not in good


def test_an_agents_instance_sees_a_step_of_one_task_on_its_node() -> None:
    from srtr.backends.agent.node_env import one_task_view

    agent_task = {
        "SLURM_JOB_ID": "66",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURMD_NODENAME": "node2",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_TASK_PID": "5142",
        "SLURM_SRUN_COMM_PORT": "41787",
        "SLURM_CPUS_PER_TASK": "2",
        "HOME": "/root",
    }
    view = one_task_view(agent_task, "node2")
    assert view["SLURM_NTASKS"] == view["SLURM_NPROCS"] == "1"
    assert view["SLURM_PROCID"] == view["SLURM_NODEID"] == view["SLURM_LOCALID"] == "0"
    assert view["SLURM_STEP_NODELIST"] == "node2"
    assert view["SLURM_JOB_NODELIST"] == "node[1-2]" and view["SLURM_JOB_ID"] == "66"
    assert not {"SLURM_TASK_PID", "SLURM_SRUN_COMM_PORT", "SLURM_CPUS_PER_TASK"} & set(view)
    assert view["HOME"] == "/root"
    assert one_task_view({"HOME": "/root"}, "node1") == {"HOME": "/root"}  # not on SLURM
