"""`gc_freeze.Freezer`: the survivors of each full pass of the collector are frozen while a
job runs; every thaw period they go back for one full pass; all go back at the end."""

from __future__ import annotations

import asyncio
import gc
import weakref

from srtr.runtime.gc_freeze import Freezer


async def _turns() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_survivors_of_a_full_pass_are_frozen_and_stop_gives_them_back() -> None:
    async def body() -> Freezer:
        freezer = Freezer()
        freezer.start()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        before = gc.get_freeze_count()
        kept = [[n] for n in range(1000)]  # lives on: frozen after the next full pass
        gc.collect()
        await _turns()
        assert freezer.freezes == 1 and gc.get_freeze_count() > before + len(kept) // 2
        freezer.stop()
        return freezer

    freezer = asyncio.run(body())
    assert gc.get_freeze_count() == 0
    gc.collect()  # no longer heard: the callback is gone
    assert freezer.freezes == 1


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_a_thaw_frees_a_cycle_that_ended_among_frozen_objects() -> None:
    async def body() -> None:
        freezer = Freezer(thaw_period=3600.0)
        freezer.start()
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        gc.collect()
        await _turns()
        assert freezer.freezes == 1  # the cycle, alive then, is frozen
        del a, b  # now garbage, and frozen: a full pass does not free it
        gc.collect()
        await _turns()
        assert gone() is not None
        freezer.thaw_period = 0.0  # the freeze after the next full pass thaws first
        gc.collect()
        await _turns()
        assert gone() is None
        freezer.stop()

    asyncio.run(body())
