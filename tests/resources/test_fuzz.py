"""Fuzz recipes and live edits: bad input gets `file:line: path: message`, never a traceback.

500 cases of each in the normal run; tests/chaos runs 10,000 (SRTR_FUZZ_CASES to change).
"""

from __future__ import annotations

import collections
import copy
import re
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srtr.resources.diff import diff
from srtr.resources.errors import RecipeError
from srtr.resources.expand import local_allocation
from srtr.resources.planning import plan_text_source

LINE = re.compile(r"^recipe\.yaml(?::\d+)?: (\S.*)$")  # group 1: the path and the message

BASE: dict[str, Any] = {
    "name": "fuzz",
    "resources": {"gpus_per_node": 8},
    "roles": {"agg": {"nodes": 1, "workers": 1, "gpus": 8, "command": ["serve"]}},
    "services": [
        {
            "name": "train",
            "command": ["sleep", "inf"],
            "nodes": 2,
            "readiness": {"port": 9000, "timeout_seconds": 30},
        },
        {"name": "napper", "command": ["sleep", "inf"], "nodes": 1},
        {
            "name": "watcher",
            "command": ["sleep", "inf"],
            "placement": {"pool": "train"},
            "env": {"A": "{node_ip}"},
            "restart": {"backoff_seconds": 0.5},
        },
    ],
    "benchmark": {"type": "custom", "command": "echo $SRT_SERVICE_TRAIN_NODES"},
    "environment": {"X": "1"},
}
ALLOCATION = local_allocation(6)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(
        ["head", "workers", "train", "trian", "../x", "a/b", "x;rm", "{node}", "never", "always"]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
keys = st.sampled_from(
    [
        "name",
        "nodes",
        "command",
        "placement",
        "pool",
        "node",
        "readiness",
        "port",
        "env",
        "restart",
        "terminal",
        "critical",
        "start",
        "metrics",
        "plcement",
        "type",
        "services",
        "roles",
        "benchmark",
        "args",
        "shutdown_tier",
        "stop_grace_seconds",
        "unknown",
    ]
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> str:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["set", "delete", "insert"]))
        if not path:
            continue
        last = path[-1]
        if action == "delete" and isinstance(parent, dict):
            parent.pop(last, None)
        elif action == "delete" and isinstance(parent, list) and len(parent) > 1:
            parent.pop(last)
        elif action == "insert" and isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent[last] = draw(values)
    text = yaml.safe_dump(doc, sort_keys=False)
    if draw(st.booleans()) and text:
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(["", ":", "- ", "{", "&a", "*a", "\t", "'"]))
        text += text[cut:]
    return text


def _check(text: str, previous: Any = None, seen: collections.Counter[str] | None = None) -> Any:
    """The plan of `text`, or None when it is a clean error; `seen` counts the outcomes:
    `planned`, or the top-level key an error's first line names."""
    try:
        planned = plan_text_source(text, "recipe.yaml", ALLOCATION, previous)[1]
    except RecipeError as exc:
        lines = exc.lines()
        assert lines, "a RecipeError without a message"
        for line in lines:
            assert LINE.match(line), line
        if seen is not None:
            first = LINE.match(lines[0])
            assert first is not None
            seen[first.group(1).split(": ")[0].split("[")[0].split(".")[0]] += 1
        return None
    if seen is not None:
        seen["planned"] += 1
    return planned


def _reached(seen: collections.Counter[str], cases: int) -> None:
    """The mutations reach the planner's depths: some recipes plan, and the errors come from
    many parts of the schema, not only from YAML that no longer parses (a regression that
    rejects everything, or a mutator that only breaks syntax, fails here)."""
    assert sum(seen.values()) >= cases // 2, seen
    assert seen["planned"] >= cases // 100, seen
    assert len([k for k in seen if k in BASE]) >= 4, seen


def fuzz_recipes(cases: int, derandomize: bool = False) -> None:
    seen: collections.Counter[str] = collections.Counter()

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutated())
    def run(text: str) -> None:
        _check(text, seen=seen)

    run()
    _reached(seen, cases)


def fuzz_edits(cases: int, derandomize: bool = False) -> None:
    base = _check(yaml.safe_dump(BASE, sort_keys=False))
    assert base is not None
    seen: collections.Counter[str] = collections.Counter()

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutated())
    def run(text: str) -> None:
        new = _check(text, base.nodes, seen)
        if new is not None:
            plan = diff(base, new, launched=frozenset(s.name for s in base.instances))
            assert plan.summary()

    run()
    _reached(seen, cases)


# The normal run uses a fixed seed so that CI is repeatable; tests/chaos explores at random.
def test_fuzz_recipes() -> None:
    fuzz_recipes(500, derandomize=True)


def test_fuzz_live_edits() -> None:
    fuzz_edits(500, derandomize=True)


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_any_text_is_a_recipe_or_a_clean_error(text: str) -> None:
    _check(text)
