"""events.jsonl's lines: the same bytes as `json.dumps` of the event, written once per loop
turn however many events the turn recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from srtr.runtime.run_files import EventFile
from srtr.store.persist import AppendFile, _event_line, event_doc
from srtr.store.status import Event, EventType
from tests.support.controller_harness import one_service_store


def test_a_line_is_the_json_encoders_byte_for_byte() -> None:
    messages = ["plain", 'quote " back \\ tab \t nl \n', "é ü 😀 \u2028 \x00 \x7f", ""]
    for ts in (1796005640.568, 1.0, 0.1, 1e20, 12345.0):
        for message in messages:
            for kind in EventType:
                event = Event(ts, kind, "Launched", "instance/a-b", message, 7)
                expected = (json.dumps(event_doc(event)) + "\n").encode()
                assert _event_line(event) == expected


def test_a_turns_events_are_one_write_after_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = one_service_store()
    ctx = cast(Any, SimpleNamespace(store=store, run_dir=tmp_path))
    events = EventFile(ctx, note=lambda _: None)
    writes: list[bytes] = []
    real = AppendFile.write

    def counted(self: AppendFile, data: bytes) -> None:
        writes.append(data)
        real(self, data)

    async def body() -> None:
        await events.start()
        for n in range(3):
            store.record("job", "Tick", str(n))
        path = tmp_path / "events.jsonl"
        assert not path.exists() or path.read_bytes() == b""  # not yet: at the turn's end
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert [e["message"] for e in lines] == ["0", "1", "2"]
        await events.stop()

    monkeypatch.setattr(AppendFile, "write", counted)
    asyncio.run(body())
    assert len(writes) == 1 and writes[0].count(b"\n") == 3
