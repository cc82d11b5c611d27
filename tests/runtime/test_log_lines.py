"""logs/srtr.log: the lines one turn of the loop logs are written together at its end."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from srtr.reconciler.clock import FakeClock
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source
from srtr.runtime.run_files import FaultReportingHandler
from srtr.store.persist import AppendFile
from srtr.store.store import Store


def _store() -> Store:
    recipe = "name: t\nservices:\n  - name: s\n    command: [sleep, inf]\n"
    _, desired = plan_text_source(recipe, "recipe.yaml", local_allocation(1))
    return Store(desired, FakeClock())


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
    handler = FaultReportingHandler("logs/srtr.log", AppendFile(path), _store().write_faults)
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
