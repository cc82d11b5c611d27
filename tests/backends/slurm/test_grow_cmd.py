"""Grow jobs' command lines and parsers (srtr.backends.slurm.grow_cmd), and how the SLURM
provisioner reads squeue (with canned SLURM answers; tests/e2e/slurm/test_grow.py runs it on
the real cluster)."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePath

import pytest

from srtr.backends.provision import ProvisionError, RequestPhase
from srtr.backends.slurm import grow_cmd as cmd
from srtr.backends.slurm.provision import SlurmProvisioner

SHOW_JOB = (
    "JobId=41 JobName=train UserId=root(0) GroupId=root(0) Priority=1 Account=rl QOS=high "
    "JobState=RUNNING Reason=None TimeLimit=02:00:00 SubmitTime=2026-12-03T05:00:00 "
    "StartTime=2026-12-03T05:00:00 EndTime=2026-12-03T07:00:00 Partition=gpu "
    "NodeList=node[1-4] Features=h100&ib OverSubscribe=NO Command=/x y"
)


def test_the_main_jobs_settings_are_read_from_scontrol() -> None:
    main = cmd.parse_main_job(SHOW_JOB)
    assert main == cmd.MainJob(
        partition="gpu",
        account="rl",
        qos="high",
        features="h100&ib",
        exclusive=True,
        end=datetime.datetime(2026, 12, 3, 7, 0, 0),
    )
    unlimited = SHOW_JOB.replace("TimeLimit=02:00:00", "TimeLimit=UNLIMITED")
    shared = unlimited.replace("OverSubscribe=NO", "OverSubscribe=OK").replace(
        "QOS=high", "QOS=(null)"
    )
    got = cmd.parse_main_job(shared)
    assert (got.end, got.exclusive, got.qos) == (None, False, "")


def test_a_grow_job_copies_the_main_job_and_ends_with_it() -> None:
    main = cmd.parse_main_job(SHOW_JOB)
    argv = cmd.sbatch_grow_argv(
        count=8,
        name="train-grow",
        main=main,
        script=PurePath("/r/grow-agent.sh"),
        output=PurePath("/r/logs/grow-%A_%a.out"),
        now=datetime.datetime(2026, 12, 3, 6, 0, 30),
    )
    assert argv == [
        "sbatch", "--parsable", "--array=1-8", "-N1", "--ntasks=1", "-J", "train-grow",
        "--no-requeue", "--output=/r/logs/grow-%A_%a.out", "--open-mode=append", "--exclusive",
        "--partition=gpu", "--account=rl", "--qos=high", "--constraint=h100&ib",
        "--time=59", "--time-min=1", "--deadline=2026-12-03T07:00:00", "/r/grow-agent.sh",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="ends within a minute"):
        cmd.sbatch_grow_argv(
            count=1,
            name="x",
            main=main,
            script=PurePath("/s"),
            output=PurePath("/o"),
            now=datetime.datetime(2026, 12, 3, 6, 59, 30),
        )


def test_squeue_tasks_are_parsed_one_per_line() -> None:
    text = "77|1|RUNNING|None|node3\n77|2|PENDING|Resources|\n77|3-8|PENDING|Resources|\n"
    rows = cmd.parse_squeue_tasks(text)
    assert [(r.task, r.running, r.reason) for r in rows] == [
        (1, True, ""),
        (2, False, "Resources"),
    ]
    never = cmd.parse_squeue_tasks("9|1|PENDING|QOSMaxNodePerJobLimit|\n")[0]
    assert never.never
    assert not rows[1].never
    assert cmd.gone_from_queue(0, "")
    assert cmd.gone_from_queue(1, "slurm_load_jobs error: Invalid job id specified")
    assert not cmd.gone_from_queue(1, "slurm_load_jobs error: Socket timed out")


class Canned:
    """SlurmCommands with canned answers: the last registered answer whose argv[0] matches."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, str, str]] = {}
        self.ran: list[list[str]] = []

    def run(
        self, argv: Sequence[str], *, check: bool = True, retry: bool = True
    ) -> subprocess.CompletedProcess[str]:
        self.ran.append(list(argv))
        code, out, err = self.answers.get(argv[0], (0, "", ""))
        return subprocess.CompletedProcess(list(argv), code, out, err)

    async def arun(
        self, argv: Sequence[str], *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run(argv, check=check)


def provisioner(tmp_path: Path, canned: Canned) -> tuple[SlurmProvisioner, list[float]]:
    now = [0.0]
    admitted: list[int] = []
    prov = SlurmProvisioner(
        canned,  # type: ignore[arg-type]
        "41",
        tmp_path,
        fingerprint="sha256:ab",
        adopt_window=60,
        files={"token": "agents.token", "rendezvous": "agents.addr"},
        admit=admitted.append,
        clock=lambda: now[0],
    )
    return prov, now


def test_a_request_pends_with_squeues_reason_then_is_granted(tmp_path: Path) -> None:
    canned = Canned()
    canned.answers["scontrol"] = (
        0,
        SHOW_JOB.replace("TimeLimit=02:00:00", "TimeLimit=UNLIMITED"),
        "",
    )
    canned.answers["sbatch"] = (0, "77\n", "")
    prov, now = provisioner(tmp_path, canned)

    async def go() -> None:
        rid = await prov.request("train", 2)
        assert rid == "77"
        script = (tmp_path / "grow-agent.sh").read_text()
        assert 'SRTR_AGENT_TOKEN=$(cat "$run/agents.token")' in script and "main=41" in script
        canned.answers["squeue"] = (0, "77|1|RUNNING|None|node3\n77|2|PENDING|Resources|\n", "")
        state = await prov.state(rid)
        assert (state.phase, state.reason) == (
            RequestPhase.PENDING,
            "1 of 2 running; the rest: Resources",
        )
        squeues = len([a for a in canned.ran if a[0] == "squeue"])
        canned.answers["squeue"] = (0, "77|1|RUNNING|None|node3\n77|2|RUNNING|None|node4\n", "")
        await prov.state(rid)  # within the period: squeue is not asked again
        assert len([a for a in canned.ran if a[0] == "squeue"]) == squeues
        prov.poke()  # an agent dialled in: soon is enough
        now[0] += 0.5
        canned.answers["scontrol"] = (
            0,
            "NodeName=node3 NodeAddr=10.0.0.3 State=ALLOCATED\n"
            "NodeName=node4 NodeAddr=10.0.0.4 State=ALLOCATED\n",
            "",
        )
        state = await prov.state(rid)
        assert state.phase is RequestPhase.GRANTED
        assert [(n.name, n.ip) for n in state.nodes] == [
            ("node3", "10.0.0.3"),
            ("node4", "10.0.0.4"),
        ]
        state = await prov.release(rid, ["node4"])
        assert canned.ran[-1] == ["scancel", "77_2"]
        assert [n.name for n in state.nodes] == ["node3"] and state.phase is RequestPhase.GRANTED
        await prov.close()
        assert canned.ran[-1] == ["scancel", "77"]
        assert prov.requests()[0].phase is RequestPhase.CANCELLED

    asyncio.run(go())


def test_sbatchs_refusal_and_a_hopeless_reason_refuse_the_request(tmp_path: Path) -> None:
    canned = Canned()
    canned.answers["scontrol"] = (
        0,
        SHOW_JOB.replace("TimeLimit=02:00:00", "TimeLimit=UNLIMITED"),
        "",
    )
    canned.answers["sbatch"] = (
        1,
        "",
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
    )
    prov, _now = provisioner(tmp_path, canned)

    async def go() -> None:
        with pytest.raises(
            ProvisionError, match=r"^Batch job submission failed: Invalid partition"
        ):
            await prov.request("train", 2)
        canned.answers["sbatch"] = (0, "78\n", "")
        rid = await prov.request("train", 1)
        canned.answers["squeue"] = (0, "78|1|PENDING|PartitionNodeLimit|\n", "")
        state = await prov.state(rid)
        assert (state.phase, state.reason) == (RequestPhase.REFUSED, "PartitionNodeLimit")
        assert canned.ran[-1] == ["scancel", "78"]

    asyncio.run(go())
