"""Autoscaled pools (`nodes: {min, max, from}`, issue 24): the recipe field, the decision,
reading the published count, and a pool that follows it end to end on the local backend."""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from srtr.net.published import read_count
from srtr.resources.autoscale import decide, parse_count, with_sizes
from srtr.resources.errors import RecipeError
from srtr.resources.loading import load_text
from srtr.resources.planning import plan_text_source
from srtr.resources.recipe import Autoscale
from srtr.resources.render import service_lines
from tests.support.e2e_util import Run, events

SCALED = """\
name: scaled
{resources}
services:
  - name: fleet
    command: ["sleep", "infinity"]
    nodes: {nodes}
  - name: agent
    command: ["sleep", "infinity"]
    placement: {{pool: fleet}}
"""


def text(nodes: str, resources: str = "") -> str:
    return SCALED.format(nodes=nodes, resources=resources)


def problems(nodes: str, resources: str = "") -> list[str]:
    with pytest.raises(RecipeError) as err:
        load_text(text(nodes, resources), "r.yaml")
    return err.value.lines()


# --- the recipe field ----------------------------------------------------------------------


def test_an_autoscaled_pool_starts_at_min_and_says_so_in_the_plan() -> None:
    recipe, state = plan_text_source(
        text("{min: 2, max: 8, from: {http: {port: 8000, path: /want}}}"), "r.yaml"
    )
    fleet = recipe.services[0]
    assert fleet.nodes == 2
    assert fleet.autoscale is not None and fleet.autoscale.max == 8
    assert state.nodes.pools["fleet"] == ("node1", "node2")
    assert "nodes=2 autoscale=2..8 from http :8000/want every 10s" in "\n".join(
        service_lines(recipe)
    )


def test_a_one_node_autoscaled_pool_names_its_instances_after_the_node() -> None:
    # Scaling 1 -> 2 must add an instance, not replace the publisher (instance 0).
    _, state = plan_text_source(text("{min: 1, max: 3, from: {file: /tmp/want}}"), "r.yaml")
    assert [s.name for s in state.instances] == ["service_fleet_node1", "service_agent_node1"]


@pytest.mark.parametrize(
    ("nodes", "resources", "expected"),
    [
        (
            "{min: 4, max: 2, from: {file: /x}}",
            "",
            "r.yaml:6: services[0].nodes: max must be >= min; got 2 < 4",
        ),
        (
            "{min: 1, max: 2, from: {file: want.txt}}",
            "",
            "r.yaml:6: services[0].nodes.from.file: must be an absolute path; got 'want.txt'",
        ),
        (
            "{min: 1, max: 2, from: {}}",
            "",
            "r.yaml:6: services[0].nodes.from: needs exactly one of http or file; got none",
        ),
        (
            "{min: 1, max: 2, from: {file: /x}, every: 3}",
            "",
            "r.yaml:6: services[0].nodes.every: unknown key 'every'; allowed: min, max, from, "
            "interval_seconds, cooldown_seconds",
        ),
        (
            "{max: 2, from: {file: /x}}",
            "",
            "r.yaml:6: services[0].nodes.min: is required",
        ),
        (
            "{min: 1, max: 8, from: {file: /x}}",
            "resources: {max_nodes: 4}",
            "r.yaml:6: services[0].nodes.max: is 8 but resources.max_nodes 4 leaves room for 4 "
            "node(s) in this pool; lower max or raise max_nodes",
        ),
    ],
)
def test_bad_autoscale_fields_point_at_their_line(
    nodes: str, resources: str, expected: str
) -> None:
    assert expected in problems(nodes, resources)


def test_autoscale_is_not_a_key_of_its_own() -> None:
    found = problems("2\n    autoscale: {min: 1, max: 2, from: {file: /x}}")
    assert any("unknown key 'autoscale'" in line for line in found), found


# --- the decision --------------------------------------------------------------------------

SCALE = Autoscale.model_validate(
    {"min": 2, "max": 8, "from": {"file": "/x"}, "cooldown_seconds": 30}
)


def test_the_published_count_is_clamped_to_the_bounds() -> None:
    assert decide(SCALE, 4, 100, now=0, last_change=None).size == 8  # type: ignore[union-attr]
    assert decide(SCALE, 4, 0, now=0, last_change=None).size == 2  # type: ignore[union-attr]
    assert decide(SCALE, 8, 100, now=0, last_change=None) is None  # at max already


def test_no_change_within_the_cooldown() -> None:
    assert decide(SCALE, 4, 6, now=10, last_change=0) is None
    later = decide(SCALE, 4, 6, now=30, last_change=0)
    assert later is not None and (later.size, later.desired) == (6, 6)


def test_with_sizes_sets_only_autoscaled_pools_within_their_bounds() -> None:
    recipe = load_text(text("{min: 1, max: 3, from: {file: /x}}"), "r.yaml")
    assert with_sizes(recipe, {"fleet": 9}).services[0].nodes == 3
    assert with_sizes(recipe, {"fleet": 2}).services[0].nodes == 2
    plain = load_text(text("2"), "r.yaml")
    assert with_sizes(plain, {"fleet": 5}).services[0].nodes == 2


@pytest.mark.parametrize(("body", "count"), [("8", 8), ("8\n", 8), ('{"desired": 3}', 3), ("0", 0)])
def test_a_published_count_is_a_number_or_json(body: str, count: int) -> None:
    assert parse_count(body) == count


@pytest.mark.parametrize("body", ["", "eight", "-1", "true", '{"want": 3}', "[1]", "2.5"])
def test_anything_else_is_no_count(body: str) -> None:
    with pytest.raises(ValueError):
        parse_count(body)


# --- reading it ----------------------------------------------------------------------------


@pytest.fixture
def publisher() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server answering GET /want with the last item of the list."""
    answer = ["5"]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 200 if self.path == "/want" else 404
            self.send_response(status)
            self.end_headers()
            self.wfile.write(answer[-1].encode())

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


def test_read_count_over_http(publisher: tuple[str, list[str]]) -> None:
    base, answer = publisher
    assert asyncio.run(read_count(f"{base}/want", 2)) == (5, f"{base}/want: 5")
    answer.append("many")
    count, why = asyncio.run(read_count(f"{base}/want", 2))
    assert count is None and why == f"{base}/want: not a node count: 'many'"
    count, why = asyncio.run(read_count(f"{base}/other", 2))
    assert count is None and why == f"{base}/other -> 404"


def test_read_count_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "want"
    count, why = asyncio.run(read_count(str(path), 2))
    assert count is None and "No such file or directory" in why
    path.write_text("3\n")
    assert asyncio.run(read_count(str(path), 2)) == (3, f"{path}: 3")


# --- end to end ----------------------------------------------------------------------------

FOLLOW = """\
name: follow
services:
  - name: fleet
    command: ["sleep", "infinity"]
    nodes: {{min: 1, max: 3, from: {{file: {want}}}, interval_seconds: 0.2, cooldown_seconds: 0}}
  - name: agent
    command: ["sleep", "infinity"]
    placement: {{pool: fleet}}
"""


@pytest.mark.e2e
def test_an_autoscaled_pool_follows_the_published_count_up_and_down(tmp_path: Path) -> None:
    want = tmp_path / "want"
    want.write_text("1\n")
    run = Run(
        tmp_path,
        FOLLOW.format(want=want),
        env={**os.environ, "SRTR_LOCAL_PROVISION_DELAY": "0.5"},
    )
    try:

        def fleet(state: dict[str, object]) -> dict[str, object]:
            return state["pools"][0]  # type: ignore[index,return-value]

        first = run.wait_state(
            lambda s: (fleet(s).get("autoscale") or {}).get("desired") == 1,
            what="the first count read",
        )
        assert fleet(first)["autoscale"]["size"] == 1  # type: ignore[index]
        want.write_text("3\n")  # past the allocation: the pool grows through a request
        grown = run.wait_state(
            lambda s: (
                fleet(s)["nodes"] == ["node1", "node2", "node3"]
                and all(i["phase"] == "Running" for i in s["instances"])
            ),
            what="the pool at 3 nodes, everything running",
        )
        assert len(grown["instances"]) == 6
        assert fleet(grown)["autoscale"]["desired"] == 3  # type: ignore[index]
        scaling = [e["message"] for e in events(run.run_dir) if e["reason"] == "Scaling"]
        assert scaling == [f"pool fleet 1 → 3 (desired 3 from {want})"]
        want.write_text("9\n")  # beyond max: clamped, and 3 is what it has
        want.write_text("1\n")
        shrunk = run.wait_state(
            lambda s: [n["name"] for n in s["nodes"]] == ["node1"], what="back to one node"
        )
        assert [i["name"] for i in shrunk["instances"]] == [
            "service_fleet_node1",
            "service_agent_node1",
        ]
        reasons = [e["reason"] for e in events(run.run_dir)]
        assert reasons.count("Scaling") >= 2 and "NodesReleased" in reasons
        # The publisher (instance 0) was never replaced: one launch of it in the whole run.
        launches = [e for e in events(run.run_dir) if e["object"] == "instance/service_fleet_node1"]
        assert [e["reason"] for e in launches].count("Launched") == 1
        want.write_text("nonsense\n")
        warned = run.wait_state(
            lambda s: (fleet(s).get("autoscale") or {}).get("error"), what="the read error"
        )
        assert "not a node count" in fleet(warned)["autoscale"]["error"]  # type: ignore[index]
        assert "ScaleReadFailed" in [e["reason"] for e in events(run.run_dir)]
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()


@pytest.mark.e2e
def test_a_saved_edit_keeps_the_autoscaled_size(tmp_path: Path) -> None:
    """A save of something else plans with the size the autoscaler chose, not `min`."""
    want = tmp_path / "want"
    want.write_text("2\n")
    run = Run(tmp_path, FOLLOW.format(want=want))
    try:
        run.wait_state(
            lambda s: (
                len(s["pools"][0]["nodes"]) == 2
                and all(i["phase"] == "Running" for i in s["instances"])
            ),
            what="the pool at 2",
        )
        edited = FOLLOW.format(want=want).replace(
            'command: ["sleep", "infinity"]\n    placement',
            'command: ["sleep", "999"]\n    placement',
        )
        run.recipe.write_text(textwrap.dedent(edited))
        after = run.wait_state(
            lambda s: s["job"]["generation"] == 3 and s["job"]["observed_generation"] == 3,
            what="the edit rolled out",
        )
        assert after["pools"][0]["nodes"] == ["node1", "node2"]
        run.signal(signal.SIGTERM)
        assert run.finish() == 143
    finally:
        run.close()
