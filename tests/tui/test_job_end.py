"""What the TUI of `srtr up` does when its job ends (srtr.tui.job_end, pure)."""

from __future__ import annotations

import asyncio

from srtr.tui import job_end

IDLE = 60.0  # seconds since the last key: nobody is reading


def end(
    code: int = 0,
    *,
    quit_when_done: bool = False,
    terminal_gone: bool = False,
    teardown_sent: bool = False,
    since_last_key: float = IDLE,
) -> job_end.JobEnd:
    return job_end.on_job_end(
        code,
        quit_when_done=quit_when_done,
        terminal_gone=terminal_gone,
        teardown_sent=teardown_sent,
        since_last_key=since_last_key,
        exit_after=3.0,
    )


def test_an_unwatched_end_closes_after_a_while() -> None:
    result = end(3)
    assert not result.exit_now and result.close_after == 3.0
    assert result.banner == "job ended (exit 3) · closing in 3s, any key keeps it open"


def test_a_reader_keeps_the_app_open_unless_the_keys_were_the_teardown() -> None:
    reading = end(0, since_last_key=1.0)
    assert not reading.exit_now and reading.close_after is None
    assert reading.banner == job_end.ended_banner(0) == "job ended (exit 0) · q quits"
    assert end(0, since_last_key=1.0, teardown_sent=True).close_after == 3.0


def test_quitting_or_a_lost_terminal_exits_at_once_even_for_a_reader() -> None:
    assert end(0, since_last_key=0.0, quit_when_done=True).exit_now
    assert end(0, since_last_key=0.0, terminal_gone=True).exit_now
    assert end(job_end.HANGUP_CODE, since_last_key=0.0).exit_now


def test_the_job_code_of_a_cancelled_or_failed_task() -> None:
    async def scenario() -> list[int | None]:
        async def ok() -> int:
            return 7

        async def boom() -> int:
            raise RuntimeError("boom")

        async def forever() -> int:
            await asyncio.Event().wait()
            return 0

        done, failed, cancelled = (asyncio.create_task(c()) for c in (ok, boom, forever))
        cancelled.cancel()
        await asyncio.wait({done, failed, cancelled})
        return [job_end.job_code(t) for t in (done, failed, cancelled)]

    assert asyncio.run(scenario()) == [7, None, 1]
