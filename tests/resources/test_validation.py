"""Every validation rule srtr implements: its message and the exact line it points at.

Rules come from three places, tested in that order: the YAML reader (`yamlmarks.py`), the
schema (`recipe.py`, field-level, V-01..V-28 in the reference's numbering) and the
whole-recipe rules (`rules.py`, V-17..V-45), plus what only the allocation can tell
(`expand.py`: short allocation, V-50 port collisions). Each recipe is written inline,
starting at line 1, so the expected line numbers can be read off the text.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from srtr.resources.errors import RecipeError, format_path
from srtr.resources.expand import local_allocation
from srtr.resources.loading import load_text
from srtr.resources.planning import plan_text_source

Found = tuple[int, str, str]  # (line, dotted path, message)


def problems(text: str, nodes: int | None = None) -> list[Found]:
    """Every problem `srtr plan` reports for `text` (dedented), as (line, path, message)."""
    allocation = local_allocation(nodes) if nodes else None
    with pytest.raises(RecipeError) as info:
        plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)
    return [(p.line, format_path(p.path), p.message) for p in info.value.problems]


def problem(text: str, nodes: int | None = None) -> Found:
    """The one problem `text` has."""
    found = problems(text, nodes)
    assert len(found) == 1, found
    return found[0]


def valid(text: str, nodes: int | None = None) -> None:
    allocation = local_allocation(nodes) if nodes else None
    plan_text_source(textwrap.dedent(text), "recipe.yaml", allocation)


# What a table case expects: `OK` (the recipe plans), `(line, path, message)` (its one
# problem), or a list of them (every problem, in line order).
OK = None
Expected = Found | list[Found] | None


def check(text: str, expected: Expected, nodes: int | None = None) -> None:
    if expected is OK:
        valid(text, nodes)
    elif isinstance(expected, list):
        assert problems(text, nodes) == expected
    else:
        assert problem(text, nodes) == expected


# --- YAML ------------------------------------------------------------------------------------

YAML_CASES = [
    pytest.param(
        "", (1, "", "the recipe is empty; it must be a mapping with at least `name`"), id="empty"
    ),
    pytest.param(
        "\n\n",
        (1, "", "the recipe is empty; it must be a mapping with at least `name`"),
        id="empty-lines",
    ),
    pytest.param(
        "# only a comment\n",
        (1, "", "the recipe is empty; it must be a mapping with at least `name`"),
        id="empty-only-a-comment",
    ),
    pytest.param(
        "- name: a\n- name: b\n",
        (1, "", "the recipe must be a mapping (key: value), not a list"),
        id="not-a-mapping-list",
    ),
    pytest.param(
        "# a recipe\n\njust text\n",
        (3, "", "the recipe must be a mapping (key: value), not a scalar"),
        id="not-a-mapping-text",
    ),
    pytest.param(
        "~\n",
        (1, "", "the recipe must be a mapping (key: value), not a scalar"),
        id="not-a-mapping-null",
    ),
    pytest.param(
        """\
        name: one
        ---
        name: two
        """,
        (2, "", "invalid YAML: but found another document"),
        id="multiple-documents",
    ),
    pytest.param(
        """\
        name: anchors
        services:
          - name: a
            command: &argv [sleep, "1"]
            env: &env
              A: "1"
          - name: b
            command: *argv
            env:
              <<: *env
              B: "2"
        """,
        OK,
        id="small-anchors-and-merge-keys-are-fine",
    ),
    pytest.param(
        """\
        name: anchors
        services:
          - &base
            name: a
            command: [sleep, "1"]
          - <<: *base
            name: b
        """,
        OK,
        id="merge-keys-can-be-overridden",
    ),
    pytest.param(
        """\
        name: dup
        services:
          - name: s
            command: [a]
            env:
              A: one
              A: two
        """,
        (7, "", "duplicate key 'A'"),
        id="duplicate-env-key",
    ),
    pytest.param(
        "name: a\nname: b\n",
        (2, "", "duplicate key 'name'"),
        id="duplicate-top-level-key",
    ),
    pytest.param(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    1: x\n",
        (5, "", "key 1 must be a string"),
        id="non-string-key",
    ),
    pytest.param(
        "name: t\nenvironment:\n  A: !!python/name:os.system\n",
        (
            3,
            "",
            "invalid YAML: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/name:os.system'",
        ),
        id="python-tags-are-not-constructed",
    ),
    pytest.param(
        "name: t\nservices: [\n",
        (3, "", "invalid YAML: expected the node content, but found '<stream end>'"),
        id="invalid-yaml-unclosed-bracket",
    ),
    pytest.param(
        "name: t\n  bad: indent\n",
        (2, "", "invalid YAML: mapping values are not allowed here"),
        id="invalid-yaml-indentation",
    ),
    pytest.param(
        "name: t\nservices:\n\t- name: s\n",
        (3, "", "invalid YAML: found character '\\t' that cannot start any token"),
        id="invalid-yaml-tab",
    ),
    pytest.param(
        'name: "t\n',
        (2, "", "invalid YAML: found unexpected end of stream"),
        id="invalid-yaml-unclosed-quote",
    ),
]


@pytest.mark.parametrize(("text", "expected"), YAML_CASES)
def test_yaml_reader(text: str, expected: Expected) -> None:
    check(text, expected)


def test_billion_laughs_alias_bomb_is_refused_quickly() -> None:
    rows = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    text = "name: bomb\n" + "\n".join(rows) + "\n"
    started = time.monotonic()
    found = problem(text)
    assert time.monotonic() - started < 2.0
    assert found == (
        1,
        "",
        "the recipe expands to more than 200,000 values through YAML anchors and aliases; "
        "refusing to load it",
    )


# --- schema: keys, names and types ------------------------------------------------------------

SCHEMA_CASES = [
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            plcement:
              node: head
        """,
        (5, "services[0].plcement", "unknown key 'plcement' (did you mean 'placement'?)"),
        id="unknown-key-did-you-mean",
    ),
    pytest.param(
        """\
        name: t
        resources:
          gpus_per_node: 8
        colour: blue
        """,
        (
            4,
            "colour",
            "unknown key 'colour'; allowed: name, resources, roles, frontend, services, benchmark, "
            "environment, observability",
        ),
        id="unknown-key-lists-the-allowed-keys",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              http:
                port: 80
                paht: /ready
        """,
        (8, "services[0].readiness.http.paht", "unknown key 'paht' (did you mean 'path'?)"),
        id="unknown-key-in-a-nested-model",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: "  "
            command: [a]
        """,
        (3, "services[0].name", "must be a non-empty string"),
        id="v16-blank-service-name",
    ),
    pytest.param(
        "name: t\nservices:\n  - command: [a]\n",
        (3, "services[0].name", "is required"),
        id="missing-service-name",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            nodes: two
            critical: maybe
            env: [a]
        """,
        [
            (5, "services[0].nodes", "must be a whole number; got 'two'"),
            (6, "services[0].critical", "must be true or false; got 'maybe'"),
            (7, "services[0].env", "must be a mapping (key: value)"),
        ],
        id="wrong-types",
    ),
    pytest.param(
        "name: t\nservices:\n  name: s\n",
        (2, "services", "must be a list"),
        id="services-must-be-a-list",
    ),
]


@pytest.mark.parametrize(("text", "expected"), SCHEMA_CASES)
def test_schema_keys_names_and_types(text: str, expected: Expected) -> None:
    check(text, expected)


@pytest.mark.parametrize("bad", ["a/b", "..", "x;rm", "a b", "ä", "$(id)"])
def test_bad_service_name_chars(bad: str) -> None:
    assert problem(f"""\
        name: t
        services:
          - name: s
            command: [a]
          - name: '{bad}'
            command: [a]
        """) == (
        5,
        "services[1].name",
        f"{bad!r} may only contain letters, digits, '-' and '_' "
        "(it becomes file, step and env var names)",
    )


@pytest.mark.parametrize("bad", ["a/b", "..", "x;rm"])
def test_bad_recipe_name_chars(bad: str) -> None:
    assert problem(f"# recipe\nname: '{bad}'\n") == (
        2,
        "name",
        f"{bad!r} may only contain letters, digits, '-' and '_' "
        "(it becomes file, step and env var names)",
    )


@pytest.mark.parametrize(
    "text",
    [
        'name: "t\\n"\n',
        'name: t\nservices:\n  - name: "s\\n"\n    command: [a]\n',
        'name: t\nenvironment:\n  "A\\n": b\n',
    ],
    ids=["recipe-name", "service-name", "env-key"],
)
def test_names_with_a_trailing_newline_are_refused(text: str) -> None:
    with pytest.raises(RecipeError):
        load_text(text)


def test_a_recipe_without_name_is_named_after_its_file() -> None:
    # issue 12: the seed's recipes have no `name:`; the file names the job.
    recipe = load_text("# a recipe without a name\nservices: []\n", "seed-pools.yaml")
    assert recipe.name == "seed-pools"


@pytest.mark.parametrize("field", ["nodes: true", "nodes: yes", "readiness:\n      port: true"])
def test_booleans_are_not_counts(field: str) -> None:
    with pytest.raises(RecipeError):
        load_text(f"name: t\nservices:\n  - name: s\n    command: [a]\n    {field}\n")


# --- schema: field-level rules (reference V-01..V-28) -----------------------------------------

FIELD_CASES = [
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            placement:
              node: rack7
        """,
        (
            6,
            "services[0].placement.node",
            "must be one of head, infra, dedicated, prefill, decode, agg, workers, compute, all; "
            "got 'rack7'",
        ),
        id="v01-placement-node-vocabulary",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            placement:
              pool: " "
        """,
        (6, "services[0].placement.pool", "must name a service that declares nodes"),
        id="v05-blank-placement-pool",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            metrics:
              - port: 0
        """,
        (6, "services[0].metrics[0].port", "must be between 1 and 65535; got 0"),
        id="v07-metrics-port-range",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              http:
                port: 80
                path: ready
            metrics:
              - port: 9000
                path: metrics
        """,
        [
            (8, "services[0].readiness.http.path", "must start with '/'"),
            (11, "services[0].metrics[0].path", "must start with '/'"),
        ],
        id="v08-paths-start-with-a-slash",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              http:
                port: 80
                status: 99
        """,
        (8, "services[0].readiness.http.status", "must be an HTTP status code; got 99"),
        id="v09-http-status",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              log:
                pattern: "ready ("
        """,
        (
            7,
            "services[0].readiness.log.pattern",
            "is not a valid regular expression: missing ), unterminated subpattern at position 6",
        ),
        id="v10-log-pattern-regex",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              file:
                path: "  "
        """,
        (7, "services[0].readiness.file.path", "must not be empty"),
        id="v11-file-path-blank",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              port: 80
              tcp:
                port: 80
        """,
        (5, "services[0].readiness", "give either port (shorthand) or tcp, not both"),
        id="v12-port-and-tcp",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              timeout_seconds: 5
        """,
        (
            5,
            "services[0].readiness",
            "needs exactly one probe: port, tcp, http, log, or file; got none",
        ),
        id="v13-no-probe",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              http:
                port: 80
              log:
                pattern: up
        """,
        (
            5,
            "services[0].readiness",
            "needs exactly one probe: port, tcp, http, log, or file; got http, log",
        ),
        id="v13-two-probes",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            readiness:
              port: 80
              timeout_seconds: 0
              interval_seconds: -0.5
        """,
        [
            (7, "services[0].readiness.timeout_seconds", "must be positive; got 0"),
            (8, "services[0].readiness.interval_seconds", "must be positive; got -0.5"),
        ],
        id="v14-timing-must-be-positive",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            stop_grace_seconds: 0.5
            readiness:
              port: 80
              timeout_seconds: 0.25
              interval_seconds: 0.1
        """,
        OK,
        id="timing-accepts-fractions",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            metrics:
              - port: 9000
                nodes: some
              - port: 9001
                name: ""
        """,
        [
            (7, "services[0].metrics[0].nodes", "must be all or first; got 'some'"),
            (9, "services[0].metrics[1].name", "must not be empty"),
        ],
        id="v15-metrics-nodes-and-name",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: []
        """,
        (4, "services[0].command", "if set, must be non-empty (omit it to use the type's default)"),
        id="v18-empty-command",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a, ""]
          - name: u
            command: [a]
            args:
              - x
              - ""
        """,
        [
            (4, "services[0].command", "command/args must not contain empty arguments"),
            (7, "services[1].args", "command/args must not contain empty arguments"),
        ],
        id="v20-empty-arguments",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            start: after_workers
        """,
        (
            5,
            "services[0].start",
            "must be one of infra, before_workers, with_workers, after_frontend; "
            "got 'after_workers'",
        ),
        id="v24-start-phase",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            cpus_per_task: 0
        """,
        (5, "services[0].cpus_per_task", "must be positive"),
        id="v25-cpus-per-task",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            env:
              1ST: x
        environment:
          A-B: x
        benchmark:
          type: custom
          command: "true"
          env:
            "A B": x
        """,
        [
            (5, "services[0].env", "key '1ST' is not a valid environment variable name"),
            (7, "environment", "env key 'A-B' is not a valid environment variable name"),
            (12, "benchmark.env", "key 'A B' is not a valid environment variable name"),
        ],
        id="env-keys-must-be-variable-names",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            restart: sometimes
          - name: u
            command: [a]
            restart:
              policy: maybe
          - name: v
            command: [a]
            restart:
              backoff_seconds: 5
              max_backoff_seconds: 1
          - name: w
            command: [a]
            restart:
              max_restarts: -1
        """,
        [
            (
                5,
                "services[0].restart",
                "must be one of never, on-failure, always or a mapping; got 'sometimes'",
            ),
            (
                9,
                "services[1].restart.policy",
                "must be one of 'never', 'on-failure' or 'always'; got 'maybe'",
            ),
            (
                12,
                "services[2].restart",
                "restart.max_backoff_seconds must be >= backoff_seconds; got 1 < 5",
            ),
            (
                18,
                "services[3].restart.max_restarts",
                "must be >= 0; got -1",
            ),
        ],
        id="restart-policy-word-and-mapping",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            shutdown_tier: -1
            stop_grace_seconds: -2
        """,
        [
            (5, "services[0].shutdown_tier", "must be >= 0; got -1"),
            (
                6,
                "services[0].stop_grace_seconds",
                "must be >= 0; got -2",
            ),
        ],
        id="shutdown-tier-and-stop-grace-not-negative",
    ),
    pytest.param(
        """\
        name: t
        resources:
          gpus_per_node: -1
        roles:
          agg:
            nodes: 0
            workers: 0
            gpus: -1
            command: []
        """,
        [
            (3, "resources.gpus_per_node", "must be >= 0; got -1"),
            (6, "roles.agg.nodes", "must be >= 1; got 0"),
            (7, "roles.agg.workers", "must be >= 1; got 0"),
            (8, "roles.agg.gpus", "must be >= 0; got -1"),
            (
                9,
                "roles.agg.command",
                "if set, must be non-empty (omit it to use the type's default)",
            ),
        ],
        id="role-field-ranges",
    ),
    pytest.param(
        """\
        name: t
        roles:
          decode:
            node: 2
        """,
        [
            (3, "roles.decode.nodes", "is required"),
            (4, "roles.decode.node", "unknown key 'node' (did you mean 'nodes'?)"),
        ],
        id="role-needs-nodes",
    ),
    pytest.param(
        """\
        name: t
        frontend:
          type: sglang
        benchmark:
          type: sa-bench
        """,
        [
            (3, "frontend.type", "must be one of 'none' or 'generic'; got 'sglang'"),
            (5, "benchmark.type", "must be one of 'manual' or 'custom'; got 'sa-bench'"),
        ],
        id="frontend-and-benchmark-types",
    ),
]


@pytest.mark.parametrize(("text", "expected"), FIELD_CASES)
def test_field_rules(text: str, expected: Expected) -> None:
    check(text, expected)


PORTS = [
    (
        "readiness:\n  port: 0",
        6,
        "services[0].readiness.port",
        "must be between 1 and 65535; got 0",
    ),
    (
        "readiness:\n  tcp:\n    port: 65536",
        7,
        "services[0].readiness.tcp.port",
        "must be between 1 and 65535; got 65536",
    ),
    (
        "readiness:\n  http:\n    port: -1",
        7,
        "services[0].readiness.http.port",
        "must be between 1 and 65535; got -1",
    ),
]


@pytest.mark.parametrize(("snippet", "line", "path", "message"), PORTS, ids=["port", "tcp", "http"])
def test_v07_port_ranges(snippet: str, line: int, path: str, message: str) -> None:
    text = "name: t\nservices:\n  - name: s\n    command: [a]\n"
    text += textwrap.indent(snippet, "    ") + "\n"
    assert problem(text) == (line, path, message)


def test_metrics_mapping_sugar_keeps_the_field_line() -> None:
    line, _, _ = problem("""\
        name: t
        services:
          - name: s
            command: [a]
            metrics:
              port: 0
        """)
    assert line == 6


def test_metrics_messages_do_not_repeat_the_path() -> None:
    _, _, message = problem(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    metrics:\n      port: 0\n"
    )
    assert message == "must be between 1 and 65535; got 0"


@pytest.mark.parametrize("count", [0, -3])
def test_v28_nodes_at_least_one(count: int) -> None:
    assert problem(f"""\
        name: t
        services:
          - name: s
            command: [a]
            nodes: {count}
        """) == (5, "services[0].nodes", f"must be at least 1; got {count}")


@pytest.mark.parametrize("command", ["", '\n  command: "   "'])
def test_custom_benchmark_needs_a_command(command: str) -> None:
    assert problem(f"name: t\nbenchmark:\n  type: custom{command}\n") == (
        2,
        "benchmark",
        "benchmark.type: custom needs a command",
    )


# --- whole-recipe rules (rules.py) ------------------------------------------------------------

METRICS_NAMES = """\
    name: t
    services:
      - name: s
        command: [a]
        metrics:
          - port: 9000
            name: {first}
          - port: 9001
            name: {second}
    """
DISTINCT_NAMES = (
    "declares 2 endpoints; give each a distinct name "
    "(it becomes the endpoint's name in the targets file)"
)

RULE_CASES = [
    pytest.param(
        """\
        name: t
        services:
          - name: a
            command: [x]
          - name: b
            command: [x]
          - name: a
            command: [y]
        """,
        [(7, "services[2].name", "must be unique; duplicate: 'a'")],
        id="v40-duplicate-names",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            type: nosuchkind
        """,
        (
            4,
            "services[0].type",
            "'nosuchkind' is not a known service type (known: dcgm-exporter, etcd, generic, "
            "gms, lmcache-server, mooncake-donor, mooncake-master, mooncake-store, nats, "
            "node-exporter, process-exporter, ray)",
        ),
        id="v17-unknown-type",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            type: generic
            nodes: 1
        """,
        (3, "services[0].command", "is required for type 'generic'"),
        id="v19-generic-needs-a-command",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: ne
            type: node-exporter
        """,
        OK,
        id="exporter-kinds-have-a-default-command",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: o
            command: [a]
            nodes: 1
            placement:
              pool: train
        """,
        (8, "services[1].nodes", "makes the service its own pool; drop placement.pool"),
        id="v29-owner-cannot-ride",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: train
            command: [a]
            nodes: 2
            placement:
              node: workers
        """,
        OK,
        id="v30-owner-with-explicit-workers-is-fine",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            placement:
              node: dedicated
        """,
        (
            6,
            "services[0].placement.node",
            "dedicated is only supported for infra-class kinds (etcd, nats); "
            "use head, infra, or workers for type 'generic'",
        ),
        id="v27-dedicated-is-for-infra-kinds-only",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: ne
            type: node-exporter
            options:
              port: 9100
              colour: red
              bind: x
        """,
        (
            5,
            "services[0].options",
            "has keys type 'node-exporter' does not understand: bind, colour",
        ),
        id="v34-unknown-options",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            nodes: 1
            terminal: true
            restart:
              policy: always
        """,
        (
            7,
            "services[0].restart",
            "terminal services end the job when they exit, so restart: always would never let the "
            "job end; use on-failure or never",
        ),
        id="terminal-with-restart-always",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: s
            command: [a]
            container: ""
        """,
        (5, "services[0].container", "must not be empty"),
        id="blank-container",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: gone
            command: [a]
            nodes: 1
            enabled: false
          - name: r1
            command: [a]
            placement:
              pool: ghost
          - name: r2
            command: [a]
            placement:
              pool: gone
          - name: r3
            command: [a]
            placement:
              pool: r1
        """,
        [
            (
                13,
                "services[2].placement.pool",
                "'ghost' names no service that declares nodes (pools: train)",
            ),
            (
                17,
                "services[3].placement.pool",
                "'gone' names no service that declares nodes (pools: train)",
            ),
            (
                21,
                "services[4].placement.pool",
                "'r1' names no service that declares nodes (pools: train)",
            ),
        ],
        id="v42-pool-names-no-owner",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: r
            command: [a]
            placement:
              pool: train
        """,
        (
            6,
            "services[0].placement.pool",
            "'train' names no service that declares nodes (pools: none)",
        ),
        id="v42-no-pools-at-all",
    ),
    pytest.param(
        """\
        name: t
        resources:
          het_jobs: true
        services:
          - name: b
            command: [a]
            nodes: 1
          - name: a
            command: [a]
            nodes: 1
        """,
        (
            3,
            "resources.het_jobs",
            "services[].nodes (pools) are not supported together with resources.het_jobs: true; "
            "owners: a, b",
        ),
        id="v41-het-jobs-and-pools",
    ),
    pytest.param(
        """\
        name: t
        roles:
          agg:
            nodes: 1
        frontend:
          type: none
        """,
        (
            6,
            "frontend.type",
            "none is only supported without engine roles (no prefill/decode/agg workers); "
            "pick a frontend for the workers or drop them",
        ),
        id="v43-frontend-none-with-roles",
    ),
    pytest.param(
        """\
        name: t
        frontend:
          type: none
          dedicated_node: true
        """,
        (
            4,
            "frontend.dedicated_node",
            "frontend.type: none has no frontend process; frontend.dedicated_node is invalid",
        ),
        id="v44-frontend-none-with-dedicated-node",
    ),
    pytest.param(
        """\
        name: t
        frontend:
          type: none
          command: [router]
        """,
        (4, "frontend.command", "frontend.type: none runs no frontend command"),
        id="frontend-none-with-command",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: train
            command: [a]
            nodes: 2
            terminal: true
          - name: eval
            command: [a]
            nodes: 1
            terminal: true
        benchmark:
          type: custom
          command: echo hi
        """,
        (
            12,
            "benchmark.type",
            "services[train, eval].terminal ends the job when the service exits, so the job "
            "cannot also run benchmark.type: custom; drop the benchmark block (manual) or the "
            "terminal flag",
        ),
        id="v45-terminal-and-custom-benchmark",
    ),
    pytest.param(
        """\
        name: t
        benchmark:
          command: echo hi
        """,
        (3, "benchmark.command", "is only run with benchmark.type: custom"),
        id="benchmark-command-needs-custom",
    ),
    pytest.param(
        """\
        name: t
        resources:
          gpus_per_node: 8
        roles:
          decode:
            nodes: 2
            workers: 3
            gpus: 8
            command: [w]
        """,
        (
            8,
            "roles.decode.gpus",
            "2 worker(s) per node × 8 GPUs exceeds resources.gpus_per_node (8)",
        ),
        id="role-gpus-fit-the-node",
    ),
    pytest.param(
        """\
        name: t
        roles:
          prefill:
            nodes: 1
            env:
              A: b
        """,
        (
            3,
            "roles.prefill.command",
            "is needed for readiness/env: a role without command only holds its nodes",
        ),
        id="role-without-command-cannot-have-readiness-or-env",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: train
            command: [a]
            nodes: 2
          - name: w
            command: [a]
            placement:
              node: head
              pool: train
        """,
        # srtr refuses node: head + pool too (the older system let it pass as a quirk)
        [(8, "services[1].placement", "give either node or pool, not both")],
        id="v06-node-and-pool",
    ),
    pytest.param(
        METRICS_NAMES.format(first="a", second="a"),
        (5, "services[0].metrics", DISTINCT_NAMES),
        id="v33-metrics-endpoints-same-name",
    ),
    pytest.param(
        METRICS_NAMES.format(first="a", second="null"),
        (5, "services[0].metrics", DISTINCT_NAMES),
        id="v33-metrics-endpoints-one-unnamed",
    ),
    pytest.param(
        METRICS_NAMES.format(first="a", second="b"), OK, id="v33-metrics-endpoints-distinct-names"
    ),
]


@pytest.mark.parametrize(("text", "expected"), RULE_CASES)
def test_recipe_rules(text: str, expected: Expected) -> None:
    check(text, expected)


@pytest.mark.parametrize("where", ["head", "infra", "compute", "all", "agg"])
def test_v30_owner_placement_must_be_workers(where: str) -> None:
    assert problem(f"""\
        name: t
        services:
          - name: train
            command: [a]
            nodes: 2
            placement:
              node: {where}
        """) == (
        7,
        "services[0].placement.node",
        f"nodes owns a pool, so placement.node must be workers, meaning that pool (got '{where}')",
    )


# --- allocation-time rules (expand.py) --------------------------------------------------------

POOLS = """\
# four nodes of work
name: pools
roles:
  agg:
    nodes: 1
services:
  - name: train
    command: [a]
    nodes: 2
  - name: napper
    command: [a]
    nodes: 1
"""


SHORT = "allocation has 3 non-reserved node(s) but the recipe needs 4"

ALLOCATION_CASES = [
    # The line of the pool that no longer fits, not the top of the file (issue 23).
    pytest.param(POOLS, 3, (12, "services[1].nodes", SHORT), id="short-allocation"),
    pytest.param(
        POOLS + "frontend:\n  dedicated_node: true\n",
        4,
        (12, "services[1].nodes", SHORT),
        id="short-allocation-with-a-dedicated-node",
    ),
    pytest.param(
        POOLS + "frontend:\n  dedicated_node: true\n",
        1,
        (2, "allocation", "dedicated node(s) for frontend require at least 2 nodes"),
        id="dedicated-node-needs-two-nodes",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: a
            command: [x]
            placement:
              node: compute
            readiness:
              port: 9000
          - name: train
            command: [y]
            nodes: 2
            readiness:
              tcp:
                port: 9000
        """,
        None,
        (
            12,
            "services[1].readiness",
            "services[a] and services[train] both listen on port 9000 on node node1; "
            "give them disjoint placements or ports",
        ),
        id="v50-port-collision",
    ),
    pytest.param(
        """\
        name: t
        roles:
          agg:
            nodes: 1
            command: [w]
            readiness:
              http:
                port: 8000
        services:
          - name: s
            command: [x]
            readiness:
              port: 8000
        """,
        None,
        (
            6,
            "roles.agg.readiness",
            "services[s] and services[agg] both listen on port 8000 on node node1; "
            "give them disjoint placements or ports",
        ),
        id="v50-port-collision-with-a-worker",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: a
            command: [x]
            nodes: 1
            readiness:
              port: 9000
          - name: b
            command: [y]
            nodes: 1
            readiness:
              port: 9000
        """,
        None,
        OK,
        id="same-port-on-disjoint-nodes-is-fine",
    ),
]


@pytest.mark.parametrize(("text", "nodes", "expected"), ALLOCATION_CASES)
def test_allocation_rules(text: str, nodes: int | None, expected: Expected) -> None:
    check(text, expected, nodes)


def test_v50_port_collision_with_the_frontend() -> None:
    line, path, _ = problem("""\
        name: t
        roles:
          agg:
            nodes: 1
            command: [w]
        services:
          - name: s
            command: [x]
            readiness:
              port: 8000
        frontend:
          command: [router]
          readiness:
            port: 8000
        """)
    assert (line, path) == (13, "frontend.readiness")


# --- several problems at once ---------------------------------------------------------------

SEVERAL_CASES = [
    pytest.param(
        """\
        name: t
        services:
          - name: a
            command: [x]
            start: soon
          - name: b/c
            command: [x]
          - name: d
            command: [x]
            readiness:
              port: 0
        frontend:
          typo: 1
        """,
        [
            (
                5,
                "services[0].start",
                "must be one of infra, before_workers, with_workers, after_frontend; got 'soon'",
            ),
            (
                6,
                "services[1].name",
                "'b/c' may only contain letters, digits, '-' and '_' "
                "(it becomes file, step and env var names)",
            ),
            (11, "services[2].readiness.port", "must be between 1 and 65535; got 0"),
            (13, "frontend.typo", "unknown key 'typo' (did you mean 'type'?)"),
        ],
        id="schema-problems",
    ),
    pytest.param(
        """\
        name: t
        services:
          - name: a
            type: generic
          - name: a
            command: [x]
            placement:
              pool: nowhere
        frontend:
          type: none
          dedicated_node: true
        """,
        [
            (3, "services[0].command", "is required for type 'generic'"),
            (5, "services[1].name", "must be unique; duplicate: 'a'"),
            (
                8,
                "services[1].placement.pool",
                "'nowhere' names no service that declares nodes (pools: none)",
            ),
            (
                11,
                "frontend.dedicated_node",
                "frontend.type: none has no frontend process; frontend.dedicated_node is invalid",
            ),
        ],
        id="rule-problems",
    ),
]


@pytest.mark.parametrize(("text", "expected"), SEVERAL_CASES)
def test_several_problems_are_reported_at_once_in_line_order(text: str, expected: Expected) -> None:
    check(text, expected)


def test_error_lines_format() -> None:
    with pytest.raises(RecipeError) as info:
        plan_text_source("name: t\nservices:\n  - name: s\n", "my/recipe.yaml")
    assert info.value.lines() == [
        "my/recipe.yaml:3: services[0].command: is required for type 'generic'"
    ]
    assert str(info.value) == info.value.lines()[0]


# --- the command line ------------------------------------------------------------------------


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srtr", "plan", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_bad_recipe_exits_2_with_file_line_path_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    plcement:\n      node: head\n"
    )
    done = run_plan(str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"{path}:5: services[0].plcement: unknown key 'plcement' (did you mean 'placement'?)\n"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "args", "expected"),
    [
        (
            b"name: t\nservices: [\n",
            (),
            "{path}:3: invalid YAML: expected the node content, but found '<stream end>'",
        ),
        (b"", (), "{path}:1: the recipe is empty; it must be a mapping with at least `name`"),
        (b"name: \xff\xfe\n", (), "{path}: the recipe is not UTF-8 text: "),
        (
            b"name: p\nservices:\n  - name: s\n    command: [a]\n    nodes: 3\n",
            ("--nodes", "2"),
            "{path}:5: services[0].nodes: "
            "allocation has 2 non-reserved node(s) but the recipe needs 3",
        ),
        (
            b"name: p\nservices:\n  - name: s\n    command: [a]\n    nodes: 3\n",
            ("--nodelist", "gpu[01-02]", "-o", "json"),
            "{path}:5: services[0].nodes: "
            "allocation has 2 non-reserved node(s) but the recipe needs 3",
        ),
    ],
    ids=["syntax", "empty", "not-utf8", "short-nodes", "short-nodelist-json"],
)
def test_cli_bad_input_never_tracebacks(
    tmp_path: Path, content: bytes, args: tuple[str, ...], expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    done = run_plan(str(path), *args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(expected.format(path=path))


def test_cli_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    done = run_plan(str(path))
    assert done.returncode == 2
    assert done.stderr == f"{path}: cannot read the recipe: No such file or directory\n"


def test_cli_dry_run_alias_exits_2_too(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: t\nframe: 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "dry-run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == f"{path}:2: frame: unknown key 'frame' (did you mean 'name'?)\n"


def test_cli_absurd_node_count_is_a_recipe_error(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\nservices:\n  - name: s\n    command: [a]\n    nodes: 1000000000\n")
    # A 250 MiB address-space cap turns the unbounded allocation into a quick MemoryError
    # instead of letting it eat the machine; a normal plan fits in it easily.
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (250 << 20, 250 << 20))\n"
        "from srtr.cli import main\n"
        f"sys.exit(main(['plan', {str(path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert done.stderr.startswith(f"{path}:")


# --- numbers: no NaN, no infinity (issue 23, item 11) -----------------------------------------

NON_FINITE = """\
name: t
roles:
  agg:
    nodes: 1
    stop_grace_seconds: .inf
frontend:
  stop_grace_seconds: .NaN
services:
  - name: s
    command: [a]
    readiness:
      port: 9000
      timeout_seconds: .nan
      interval_seconds: .inf
    restart:
      policy: always
      backoff_seconds: .nan
      max_backoff_seconds: .inf
      reset_after_seconds: -.inf
      window_seconds: .nan
    stop_grace_seconds: .inf
    build_timeout_seconds: .nan
"""
FINITE = "must be a finite number (.nan and .inf are not accepted)"


def test_nan_and_inf_are_refused_for_every_float_field_with_its_line() -> None:
    found = problems(NON_FINITE)
    assert [(line, path) for line, path, _ in found] == [
        (5, "roles.agg.stop_grace_seconds"),
        (7, "frontend.stop_grace_seconds"),
        (13, "services[0].readiness.timeout_seconds"),
        (14, "services[0].readiness.interval_seconds"),
        (17, "services[0].restart.backoff_seconds"),
        (18, "services[0].restart.max_backoff_seconds"),
        (19, "services[0].restart.reset_after_seconds"),
        (20, "services[0].restart.window_seconds"),
        (21, "services[0].stop_grace_seconds"),
        (22, "services[0].build_timeout_seconds"),
    ]
    assert all(message.startswith(FINITE + "; got ") for _, _, message in found)
    assert found[2][2].endswith("got nan") and found[6][2].endswith("got -inf")


def _models(model: type, seen: set[type]) -> set[type]:
    from srtr.resources.loading import _unwrap

    if model in seen:
        return seen
    seen.add(model)
    for field in model.model_fields.values():  # type: ignore[attr-defined]
        inner = _unwrap(field.annotation)
        if inner is not None:
            _models(inner, seen)
    return seen


def test_every_recipe_model_refuses_nan_and_inf() -> None:
    """A float field added later is covered too: the rule is on every model, not per field."""
    from srtr.resources.recipe import Recipe

    models = _models(Recipe, set())
    assert len(models) > 10
    assert [m.__name__ for m in models if m.model_config.get("allow_inf_nan") is not False] == []


def test_plan_refuses_a_nan_timeout_with_file_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "nan.yaml"
    path.write_text(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    readiness:\n"
        "      port: 9000\n      timeout_seconds: .nan\n"
    )
    done = run_plan(str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (f"{path}:7: services[0].readiness.timeout_seconds: {FINITE}; got nan\n")


# --- messages in one style (issue 23, item 14) -------------------------------------------------


def test_a_shell_string_as_command_says_it_is_an_argv_list_and_how_to_write_it() -> None:
    assert problem("name: t\nservices:\n  - name: s\n    command: python serve.py --port 80\n") == (
        4,
        "services[0].command",
        'must be an argv list like ["python", "serve.py"], never run by a shell (shell text '
        "goes in `preamble`); got 'python serve.py --port 80': "
        'write ["python", "serve.py", "--port", "80"]',
    )
    _, _, message = problem("name: t\nservices:\n  - name: s\n    command: a | b\n")
    assert message.endswith('write ["bash", "-c", ...], or put the shell text in `preamble`')


def test_an_argv_list_as_preamble_says_it_is_shell_text() -> None:
    assert problem(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    preamble: [source, env.sh]\n"
    ) == (
        5,
        "services[0].preamble",
        "must be shell text, one string (an argv list goes in `command`); got ['source', 'env.sh']",
    )


def test_every_bad_env_key_is_reported_at_once() -> None:
    _, path, message = problem(
        'name: t\nservices:\n  - name: s\n    command: [a]\n    env: {"1a": x, OK: y, "b-c": z}\n'
    )
    assert path == "services[0].env"
    assert message == "keys '1a', 'b-c' are not valid environment variable names"


def test_range_and_type_errors_say_must_be_and_what_they_got() -> None:
    found = problems(
        "name: t\nservices:\n  - name: s\n    command: [a]\n    nodes: 0\n"
        "    restart: {policy: sometimes}\n    stop_grace_seconds: -1\n    critical: 3\n"
    )
    assert [m for _, _, m in found] == [
        "must be at least 1; got 0",
        "must be one of 'never', 'on-failure' or 'always'; got 'sometimes'",
        "must be >= 0; got -1",
        "must be true or false; got 3",
    ]
    assert not any("Input should" in m for _, _, m in found)
