"""The agent backend's live attempts, indexed by node: a lost node's instances are found
without a pass over the whole job's, and the index follows every change."""

from __future__ import annotations

from srtr.backends.agent.roster import Live, LiveAttempts


def test_the_index_follows_launches_moves_and_ends() -> None:
    live = LiveAttempts()
    live["b"] = Live("node1", 0, 10)
    live["a"] = Live("node1", 0, 11)
    live["c"] = Live("node2", 0, 12)
    assert live.on("node1") == ["a", "b"]  # name order, as the reports go out
    live["b"] = Live("node2", 1, 13)  # a new attempt of b, on another node
    assert (live.on("node1"), live.on("node2")) == (["a"], ["b", "c"])
    del live["c"]
    assert live.on("node2") == ["b"] and "c" not in live
    assert live.on("node9") == []
    assert dict(live) == {"a": Live("node1", 0, 11), "b": Live("node2", 1, 13)}
