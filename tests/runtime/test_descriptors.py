"""The controller's descriptor budget: each launcher's count per node and per instance, the
two descriptor tables bounded one by one, and the one-line refusal of a job that cannot fit."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from srtr.backends.agent.backend import _capabilities
from srtr.backends.agent.channel import FDS_PER_AGENT
from srtr.backends.agent.hollow_starter import HollowAgents
from srtr.backends.agent.starters import LocalAgents, SlurmAgents
from srtr.backends.base import Capabilities, Descriptors
from srtr.backends.local.backend import LocalBackend
from srtr.resources.errors import RecipeError
from srtr.runtime import descriptors
from srtr.runtime.descriptors import BASE, WATCHER_BASE, check, needed

HOLLOW = _capabilities(None, HollowAgents.__new__(HollowAgents)).descriptors


@pytest.fixture
def limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The limit `check` sees after raising the soft one (the host's is left alone)."""
    value = [20_000]
    monkeypatch.setattr(descriptors, "raise_soft_limit", lambda: value[0])
    yield value


def test_agents_count_their_connections_and_nothing_per_instance() -> None:
    assert HOLLOW.per_node == FDS_PER_AGENT and HOLLOW.per_instance == 0
    assert HOLLOW.watched_per_node == HOLLOW.watched_per_instance == 0
    local = _capabilities(None, LocalAgents.__new__(LocalAgents)).descriptors
    # Each local agent also holds its node's view and a pidfd in the exit watcher's table.
    assert (local.per_node, local.watched_per_node) == (FDS_PER_AGENT + 1, 1)
    slurm = _capabilities(None, SlurmAgents.__new__(SlurmAgents)).descriptors
    assert slurm.per_node == FDS_PER_AGENT and slurm.per_instance == 0


def test_the_fuller_table_decides() -> None:
    # Hollow: the agents' connections in the main table, nothing per instance.
    assert needed(80_000, 10_000, HOLLOW) == BASE + FDS_PER_AGENT * 10_000
    # Process per instance: its pidfd lives in the exit watcher's table, apart from the
    # main table's node views and probe sockets; the limit bounds each table alone.
    local = LocalBackend.capabilities.descriptors
    assert needed(8_000, 4, local) == BASE + 4 + 8_000
    assert needed(8_000, 4, Descriptors(per_instance=0)) == WATCHER_BASE + 8_000
    assert Capabilities().descriptors == Descriptors()


def test_the_largest_hollow_job_that_fits_runs_and_one_more_node_is_refused(
    limit: list[int],
) -> None:
    most = (limit[0] - BASE) // FDS_PER_AGENT
    check(most * 8, most, HOLLOW)  # no raise: instances cost the controller nothing here
    with pytest.raises(RecipeError) as raised:
        check((most + 1) * 8, most + 1, HOLLOW)
    text = str(raised.value)
    assert "\n" not in text.strip()
    assert f"{(most + 1) * 8} instance(s) on {most + 1} node(s)" in text
    assert f"RLIMIT_NOFILE {limit[0]}" in text


def test_no_limit_refuses_nothing(limit: list[int]) -> None:
    limit[0] = resource.RLIM_INFINITY
    check(10**7, 10**6, Descriptors())


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 64:
        pytest.skip("needs a finite hard limit to lower the soft one under")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard // 2), hard))
    try:
        assert descriptors.raise_soft_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
