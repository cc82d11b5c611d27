"""state.json's `nodes`: built once per allocation, a list of its own for each caller."""

from __future__ import annotations

from srtr.resources.objects import NodeSpec
from srtr.store.persist import _node_docs


def test_the_same_allocation_reuses_its_records_and_a_new_one_is_read_again() -> None:
    first = (NodeSpec("n1", "10.0.0.1", "worker"), NodeSpec("n2", "10.0.0.2", "spare"))
    docs = _node_docs(first)
    assert docs == [
        {"name": "n1", "ip": "10.0.0.1", "state": "worker"},
        {"name": "n2", "ip": "10.0.0.2", "state": "spare"},
    ]
    docs.append({"name": "x", "ip": "", "state": ""})  # a caller's own list
    again = _node_docs(first)
    assert len(again) == 2 and again[0] is docs[0]  # the same records, not rebuilt
    second = (NodeSpec("n1", "10.0.0.1", "pool:train"),)
    assert _node_docs(second) == [{"name": "n1", "ip": "10.0.0.1", "state": "pool:train"}]
