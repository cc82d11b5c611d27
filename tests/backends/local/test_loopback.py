"""Loopback blocks: a local job's nodes are on a block of addresses no other local job holds
(127.B.0.0/16), held by an abstract socket that dies with its holders; a job adopting one
takes the block's other slot, so the block is never free in between."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from srtr.backends.local import loopback
from srtr.backends.local.backend import LocalBackend
from srtr.backends.local.loopback import BLOCK_NODES, LoopbackBlock, NetworkTaken, block_of
from srtr.backends.provision import LocalProvisioner, ProvisionError


def test_two_claims_get_two_blocks_and_a_release_frees_one() -> None:
    first = loopback.claim()
    second = loopback.claim()
    try:
        assert first.index != second.index
        assert loopback.held(first.index) and loopback.held(second.index)
    finally:
        first.release()
        second.release()
    assert not loopback.held(first.index)
    assert not loopback.held(second.index)


def test_an_adopter_takes_the_other_slot_and_the_block_stays_held() -> None:
    job = loopback.claim()
    adopter = loopback.reclaim(job.index)  # the crashed controller's guard still holds `job`
    try:
        with pytest.raises(NetworkTaken, match="held by other processes"):
            loopback.reclaim(job.index)  # both slots taken: a second adopter is refused
        job.release()  # the old guard leaves
        assert loopback.held(job.index)
        other = loopback.claim()
        assert other.index != job.index  # a new job never gets it
        other.release()
    finally:
        adopter.release()
    assert not loopback.held(job.index)


def test_block_addresses() -> None:
    block = LoopbackBlock(3)
    assert block.cidr == "127.3.0.0/16"
    assert [block.ip(k) for k in (1, 2, 254, 255)] == [
        "127.3.0.2",
        "127.3.0.3",
        "127.3.0.255",
        "127.3.1.0",
    ]
    assert block.ip(BLOCK_NODES) == "127.3.255.254"
    with pytest.raises(ValueError, match="at most 65533 nodes"):
        block.ip(BLOCK_NODES + 1)
    assert LoopbackBlock().ip(1) == "127.0.0.2"  # block 0: what a lone job always had


def test_the_backend_and_the_provisioner_use_the_block() -> None:
    block = LoopbackBlock(7)
    backend = LocalBackend(2, block=block)
    assert [(n.name, n.ip) for n in backend.nodes()] == [
        ("node1", "127.7.0.2"),
        ("node2", "127.7.0.3"),
    ]
    with pytest.raises(ValueError, match="loopback block"):
        LocalBackend(BLOCK_NODES + 1)

    async def grow() -> None:
        provisioner = LocalProvisioner(3, delay=0, block=block)
        rid = await provisioner.request("run", 2)
        state = await provisioner.state(rid)
        assert [n.ip for n in state.nodes] == ["127.7.0.4", "127.7.0.5"]
        with pytest.raises(ProvisionError, match="no room"):
            await provisioner.request("run", BLOCK_NODES)

    asyncio.run(grow())


def test_block_of_state_json() -> None:
    assert block_of("127.12.0.0/16") == 12
    assert block_of(None) == 0  # recorded before blocks: block 0
    with pytest.raises(ValueError):
        block_of("10.0.0.0/16")


def test_up_refuses_more_nodes_than_a_block_before_starting_anything(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nservices:\n  - {name: a, nodes: 1, command: [sleep, '1']}\n")
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "srtr", "up", str(recipe), "--headless", "--nodes", "70000"]
    done = subprocess.run(
        [*argv, "--run-dir", str(run_dir), "--backend", "local"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--nodes: must be at most 65533 on the local backend" in done.stderr
    assert not run_dir.exists()
