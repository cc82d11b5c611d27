"""The two processes of `srtr up` on a terminal (`srtr.tui.up_process`): the job's outcome
through the pipe, what the TUI's exit status says, and the parent's SIGHUP guard."""

from __future__ import annotations

import asyncio
import os
import signal
import site
import subprocess
import sys
from pathlib import Path

import pytest

import srtr
from srtr.tui import up_process


async def _outcome_of(write_side: bytes | None, *, raised: bool = False) -> asyncio.Future[int]:
    """The TUI's future after the parent wrote `write_side` (None: `tell` of a job), then
    closed its end."""
    read, write = os.pipe()
    got = up_process.outcome(read)
    loop = asyncio.get_running_loop()
    if write_side is None:
        job: asyncio.Future[int] = loop.create_future()
        if raised:
            job.set_exception(ValueError("boom"))
        else:
            job.set_result(130)
        up_process.tell(write, job)
    else:
        os.write(write, write_side)
        os.close(write)
    await asyncio.wait_for(asyncio.wait((got,)), 10)
    return got


def test_the_tui_gets_the_jobs_exit_code() -> None:
    assert asyncio.run(_outcome_of(None)).result() == 130


def test_a_job_that_raised_fails_the_tuis_job() -> None:
    got = asyncio.run(_outcome_of(None, raised=True))
    with pytest.raises(RuntimeError, match="the job raised"):
        got.result()


def test_a_parent_gone_without_an_outcome_fails_the_tuis_job() -> None:
    got = asyncio.run(_outcome_of(b""))
    with pytest.raises(RuntimeError, match="without its job's end"):
        got.result()


def test_an_outcome_in_pieces_is_read_whole() -> None:
    async def main() -> int:
        read, write = os.pipe()
        got = up_process.outcome(read)
        os.write(write, b"1")
        await asyncio.sleep(0)  # a turn of the loop: the reader may see the first piece alone
        os.write(write, b"43\n")
        os.close(write)
        return await asyncio.wait_for(got, 10)

    assert asyncio.run(main()) == 143


def test_telling_a_tui_that_is_gone_raises_nothing() -> None:
    read, write = os.pipe()
    os.close(read)

    async def main() -> None:
        job: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        job.set_result(0)
        up_process.tell(write, job)

    asyncio.run(main())
    with pytest.raises(OSError):
        os.fstat(write)  # closed by tell


def test_the_exit_statuses_that_mean_the_terminal_went_away() -> None:
    assert up_process.hung_up(up_process.GONE)
    assert up_process.hung_up(-signal.SIGHUP)
    assert not up_process.hung_up(0)
    assert not up_process.hung_up(1)
    assert not up_process.hung_up(up_process.DETACHED)


def test_no_sighup_to_itself_once_the_job_took_its_handler_away() -> None:
    """The job removes its handlers as it ends; SIGHUP's default action would then kill."""
    code = "import signal; from srtr.tui import up_process; up_process.hang_up(); print('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "alive", done


def test_sighup_to_itself_while_the_job_handles_it() -> None:
    code = (
        "import signal; from srtr.tui import up_process\n"
        "got = []\n"
        "signal.signal(signal.SIGHUP, lambda *a: got.append(1))\n"
        "up_process.hang_up()\n"
        "print(len(got))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "1", done


def test_the_plan_line_hands_over_its_descriptor_and_the_outcome_still_comes() -> None:
    async def main() -> tuple[int, int]:
        read, write = os.pipe()
        plan: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        got = up_process.outcome(read, plan)
        os.write(write, up_process.PLAN + b"7")
        await asyncio.sleep(0)  # a line in pieces: the reader may see the first alone
        os.write(write, b"\n0\n")
        os.close(write)
        await asyncio.wait_for(asyncio.wait((got,)), 10)
        return plan.result(), got.result()

    assert asyncio.run(main()) == (7, 0)


def test_the_tuis_process_gets_this_srtr_first_unless_a_site_directory_has_it() -> None:
    repo = str(Path(srtr.__file__).resolve().parent.parent)
    env = up_process.child_env({"PYTHONPATH": "/elsewhere"})
    if repo in {str(Path(p).resolve()) for p in site.getsitepackages()}:
        assert env["PYTHONPATH"] == "/elsewhere"  # installed: nothing shadows PYTHONPATH
    else:
        assert env["PYTHONPATH"] == f"{repo}{os.pathsep}/elsewhere"
    # Named already: not twice.
    assert up_process.child_env({"PYTHONPATH": repo}) == {"PYTHONPATH": repo}
