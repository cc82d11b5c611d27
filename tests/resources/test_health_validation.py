"""Plan-time rules of liveness, readiness.failure_threshold and restart.scope, and the warning
for a terminal pool that can hang: message and line, as `srtr plan` prints them."""

from __future__ import annotations

import textwrap

import pytest

from srtr.resources.expand import local_allocation
from srtr.resources.objects import ProbeKind
from srtr.resources.planning import plan_text_source
from tests.resources.test_validation import check, problem

BASE = """\
name: t
services:
  - name: web
    command: [serve]
"""


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            "    liveness: {exec: {command: [check]}, failure_threshold: 0}\n",
            (5, "services[0].liveness.failure_threshold", "must be >= 1; got 0"),
        ),
        (
            "    liveness: {log: {silence_seconds: 5}, interval_seconds: 10}\n",
            (
                5,
                "services[0].liveness",
                "log.silence_seconds (5) must be at least interval_seconds (10)",
            ),
        ),
        (
            "    liveness: {interval_seconds: 10}\n",
            (
                5,
                "services[0].liveness",
                "needs exactly one probe: port, tcp, http, file, exec, or log; got none",
            ),
        ),
        (
            "    readiness: {port: 80, failure_threshold: 0}\n",
            (5, "services[0].readiness.failure_threshold", "must be >= 1; got 0"),
        ),
        (
            "    restart: {scope: pool}\n",
            (
                5,
                "services[0].restart.scope",
                "pool applies to pool owners (services with nodes) only; a rider or a "
                "service outside a pool restarts on its own",
            ),
        ),
        ("    liveness: {log: {silence_seconds: 30}, interval_seconds: 5}\n", None),
    ],
)
def test_liveness_and_scope_rules(block: str, expected: tuple[int, str, str] | None) -> None:
    check(BASE + block, expected)


def test_scope_pool_is_refused_on_a_rider_and_with_policy_never() -> None:
    rider = BASE.replace("command: [serve]", "command: [serve]\n    nodes: 2") + (
        "  - name: side\n"
        "    command: [side]\n"
        "    placement: {pool: web}\n"
        "    restart: {policy: on-failure, scope: pool}\n"
    )
    line, path, _ = problem(rider)
    assert (line, path) == (9, "services[1].restart.scope")
    never = BASE.replace("command: [serve]", "command: [serve]\n    nodes: 2") + (
        "    restart: {policy: never, scope: pool}\n"
    )
    assert problem(never) == (
        6,
        "services[0].restart.scope",
        "pool needs policy on-failure or always (never restarts nothing)",
    )


def test_liveness_is_refused_on_an_external_service() -> None:
    recipe = """\
    name: t
    services:
      - name: etcd
        type: etcd
        external: "http://10.0.0.1:2379"
        liveness: {port: 2379}
    """
    assert problem(recipe) == (
        6,
        "services[0].liveness",
        "needs a process to watch; an external service launches nothing",
    )


TERMINAL = """\
name: t
services:
  - name: train
    command: [train]
    nodes: 2
    terminal: true
"""


def warnings_of(text: str) -> tuple[str, ...]:
    _, state = plan_text_source(textwrap.dedent(text), "recipe.yaml", local_allocation(2))
    return state.line_warnings


def test_a_terminal_pool_that_can_hang_is_warned_about() -> None:
    assert warnings_of(TERMINAL) == (
        "recipe.yaml:3: warning: services[0]: is a terminal pool of 2 nodes with neither "
        "critical: true nor restart.scope: pool; one failed member leaves the others waiting "
        "forever",
    )
    assert warnings_of(TERMINAL + "    critical: true\n") == ()
    assert warnings_of(TERMINAL + "    restart: {scope: pool}\n") == ()
    assert warnings_of(TERMINAL.replace("nodes: 2", "nodes: 1")) == ()


def test_liveness_specs_render_placeholders_per_instance() -> None:
    recipe = TERMINAL + (
        "    liveness:\n"
        "      file: {path: '/tmp/beat-{node}', max_age_seconds: 30}\n"
        "      interval_seconds: 5\n"
        "      timeout_seconds: 2\n"
    )
    _, state = plan_text_source(recipe, "recipe.yaml", local_allocation(2))
    probes = [s.liveness for s in state.instances]
    assert [p.path for p in probes if p] == ["/tmp/beat-node1", "/tmp/beat-node2"]
    first = probes[0]
    assert first is not None and first.kind is ProbeKind.FILE
    assert (first.max_age_seconds, first.interval_seconds, first.timeout_seconds) == (30, 5, 2)
    assert first.failure_threshold == 3 and first.initial_delay_seconds == 0
