"""logs/srtr.log: the lines one turn of the loop logs are written together at its end."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from srtr.runtime.run_files import FaultReportingHandler, LogFile, _asctime
from srtr.store.persist import AppendFile
from tests.support.controller_harness import one_service_store


def test_a_turns_lines_are_one_write_and_close_writes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "srtr.log"
    writes: list[bytes] = []
    real = AppendFile.write

    def counted(self: AppendFile, data: bytes) -> None:
        writes.append(data)
        real(self, data)

    monkeypatch.setattr(AppendFile, "write", counted)
    handler = FaultReportingHandler(
        "logs/srtr.log", AppendFile(path), one_service_store().write_faults
    )
    logger = logging.getLogger("srtr.test_log_lines")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    async def body() -> None:
        handler.loop = asyncio.get_running_loop()
        for n in range(3):
            logger.info("line %d", n)
        assert writes == []  # at the end of the turn
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(writes) == 1 and path.read_text() == "line 0\nline 1\nline 2\n"
        logger.info("last")  # logged, and the handler closed before the turn ends

    try:
        asyncio.run(body())
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert path.read_text().endswith("line 2\nlast\n")


def test_an_events_stamp_is_loggings_asctime() -> None:
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    for now in (1796005640.0, 1796005640.5679, 1796005641.999, 1700000000.0001):
        record = logging.LogRecord("srtr", logging.INFO, "", 0, "m", None, None)
        record.created = now
        record.msecs = int((now - int(now)) * 1000) + 0.0  # as LogRecord computes it
        assert _asctime(now) == formatter.formatTime(record)


def test_events_and_log_records_share_srtr_log_in_order(tmp_path: Path) -> None:
    store = one_service_store()
    (tmp_path / "logs").mkdir()
    files = LogFile(cast(Any, SimpleNamespace(store=store, run_dir=tmp_path)))

    async def body() -> None:
        await files.start()
        store.record("instance/a", "Launched", "on node1 (pid 7)")
        logging.getLogger("srtr").info("agents: the agent of %s is connected", "node1")
        store.record("job", "Tick", "é", warning=True)
        await files.stop()
        store.record("job", "Late", "after the log closed")  # dropped, not reopened

    asyncio.run(body())
    lines = (tmp_path / "logs" / "srtr.log").read_text().splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    expected = [
        r"INFO Normal Launched instance/a: on node1 \(pid 7\)",
        r"INFO agents: the agent of node1 is connected",
        r"INFO Warning Tick job: é",
    ]
    assert len(lines) == 3
    for line, rest in zip(lines, expected, strict=True):
        assert re.fullmatch(f"{stamp} {rest}", line), line
