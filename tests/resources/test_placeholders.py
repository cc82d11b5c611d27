"""Placeholders: literal `{key}` substitution of known keys only, and never a shell (S-50, S-51).

`render` is tested on its own, then through `expand`, which renders argv elements, env values,
the preamble and the file probe's path per instance, and leaves everything else as written.
"""

from __future__ import annotations

import textwrap

import pytest

from srtr.resources.expand import expand
from srtr.resources.loading import load_text
from srtr.resources.placeholders import KEYS, render

VALUES = {
    "node": "n2",
    "node_ip": "10.0.0.2",
    "index": "1",
    "pool_ip": "10.0.0.1",
    "pool_nodes": "n1,n2",
}


@pytest.mark.parametrize(
    "text",
    [
        '{"key": "value", "n": 1}',  # JSON in an env value
        '{"node": "x"}',  # JSON whose key is a placeholder name, with quotes
        "${HOME}",
        "$HOME/{foo}",
        "{foo}",
        "{NODE}",  # keys are lower case
        "{ node }",
        "{node_ip_v6}",
        "{}",
        "{{}}",
        "{",
        "}",
        "{index",
        "node}",
        "{0}",
        "{node-ip}",
        "%(node)s",
        "$node",
        "",
    ],
)
def test_unknown_braces_are_left_untouched(text: str) -> None:
    assert render(text, VALUES) == text


def test_known_keys_are_replaced_literally() -> None:
    assert render("--node-rank={index}", VALUES) == "--node-rank=1"
    assert render("{node}:{node_ip}/{index}", VALUES) == "n2:10.0.0.2/1"
    assert render("{node}{node}", VALUES) == "n2n2"
    assert render("${node}", VALUES) == "$n2"  # only the braces are ours
    assert render("{{node}}", VALUES) == "{n2}"  # no escaping: the inner key still matches
    assert render('{"addr": "{pool_ip}"}', VALUES) == '{"addr": "10.0.0.1"}'


def test_keys_without_a_value_stay_as_written() -> None:
    assert render("{head_ip}", VALUES) == "{head_ip}"  # a known key, but not given here


def test_substituted_values_are_not_rendered_again() -> None:
    values = {"node": "{index}", "index": "7"}
    assert render("{node}-{index}", values) == "{index}-7"


def test_values_are_inserted_verbatim() -> None:
    # regex replacement syntax in a value must not be interpreted
    values = {"node": r"a\1b\g<0>$&", "index": "$(reboot); `id` && rm -rf /"}
    assert render("{node}", values) == r"a\1b\g<0>$&"
    assert render("x {index} y", values) == "x $(reboot); `id` && rm -rf / y"


def test_the_documented_keys_are_known() -> None:
    for key in (
        "index",
        "node",
        "node_ip",
        "pool_node",
        "pool_ip",
        "pool_nodes",
        "pool_ips",
        "pool_node_count",
        "gpus_per_node",
        "head_node",
        "head_ip",
    ):
        assert key in KEYS


# --- through expand --------------------------------------------------------------------------

RECIPE = """\
name: ph
resources:
  gpus_per_node: 4
roles:
  agg:
    nodes: 1
    command: [worker, "--rank={index}", "--at={node_ip}"]
services:
  - name: train
    nodes: 2
    command:
      - python3
      - -c
      - "import sys; print(sys.argv)"
      - "{index}"
      - "{node} {node_ip}"
      - "${HOME}"
      - "{foo}"
      - '{"json": true, "ip": "{node_ip}"}'
      - "$(touch /tmp/pwned); echo {node}"
      - "*"
    args: ["--pool={pool_ips}", "--count={pool_node_count}"]
    env:
      JSON: '{"nodes": "{pool_nodes}", "x": {"y": 1}}'
      SHELLISH: "${PATH}:{node}"
      UNKNOWN: "{nope}"
      GPUS: "{gpus_per_node}"
      JOB: "{job_name}/{role}/{node_id}"
      HEAD: "{head_node}={head_ip} infra={infra_node}={infra_ip}"
    preamble: |
      export RANK={index}   
      echo "{pool_node} ${UNSET:-x}"

    container: "registry/{node}:latest"
    readiness:
      file:
        path: "ready-{node}-{index}.txt"
benchmark:
  type: custom
  command: "echo {node} $SRT_SERVICE_TRAIN_IPS"
"""


def alloc(count: int) -> list[tuple[str, str]]:
    return [(f"n{k}", f"10.0.0.{k}") for k in range(1, count + 1)]


@pytest.fixture(scope="module")
def state():
    return expand(load_text(RECIPE), alloc(3))


def test_argv_elements_are_rendered_one_by_one_and_never_split(state) -> None:
    inst = state.instance("service_train_n3")
    assert inst.argv == (
        "python3",
        "-c",
        "import sys; print(sys.argv)",
        "1",
        "n3 10.0.0.3",  # one argv element, spaces and all
        "${HOME}",
        "{foo}",
        '{"json": true, "ip": "10.0.0.3"}',
        "$(touch /tmp/pwned); echo n3",
        "*",
        "--pool=10.0.0.2,10.0.0.3",
        "--count=2",
    )
    assert inst.shell is False
    assert all(not i.shell for i in state.instances if i.name != "benchmark")


def test_env_values_are_rendered_keys_are_not(state) -> None:
    env = dict(state.instance("service_train_n2").env)
    assert env == {
        "JSON": '{"nodes": "n2,n3", "x": {"y": 1}}',
        "SHELLISH": "${PATH}:n2",
        "UNKNOWN": "{nope}",
        "GPUS": "4",
        "JOB": "ph/workers/1",  # node_id: n2 is second in compute (n1 is the worker node)
        "HEAD": "n1=10.0.0.1 infra=n1=10.0.0.1",
    }


def test_preamble_is_rendered_and_right_stripped(state) -> None:
    assert state.instance("service_train_n3").preamble == (
        'export RANK=1   \necho "n2 ${UNSET:-x}"'
    )


def test_file_probe_path_is_rendered_per_instance(state) -> None:
    assert state.instance("service_train_n2").probe.path == "ready-n2-0.txt"
    assert state.instance("service_train_n3").probe.path == "ready-n3-1.txt"


def test_container_is_not_rendered(state) -> None:
    assert state.instance("service_train_n2").container == "registry/{node}:latest"


def test_worker_argv_is_rendered(state) -> None:
    assert state.instance("worker_agg_0").argv == ("worker", "--rank=0", "--at=10.0.0.1")


def test_benchmark_command_is_shell_text_left_as_written(state) -> None:
    bench = state.instance("benchmark")
    assert bench.shell is True
    assert bench.argv == ("echo {node} $SRT_SERVICE_TRAIN_IPS",)


def test_unknown_braces_survive_the_plan_json(tmp_path, capsys) -> None:
    import json

    from srtr.cli import main

    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    assert main(["plan", str(path), "-o", "json", "--nodes", "3"]) == 0
    plan = json.loads(capsys.readouterr().out)
    (inst,) = [i for i in plan["instances"] if i["name"] == "service_train_node2"]
    assert inst["command"][5:7] == ["${HOME}", "{foo}"]
    assert inst["env"]["UNKNOWN"] == "{nope}"
    assert inst["env"]["JSON"] == '{"nodes": "node2,node3", "x": {"y": 1}}'


def test_numbers_in_argv_and_env_are_text() -> None:
    state = expand(
        load_text(
            textwrap.dedent("""\
            name: nums
            services:
              - name: s
                command: [sleep, 1, 2.5]
                env:
                  PORT: 8000
                  FLAG: true
            """)
        ),
        alloc(1),
    )
    inst = state.instance("service_s")
    assert inst.argv == ("sleep", "1", "2.5")
    assert dict(inst.env) == {"PORT": "8000", "FLAG": "true"}


@pytest.mark.parametrize("written", ["0755", "1.10", "0x1F", "1_000"])
def test_numbers_keep_the_text_as_written(written: str) -> None:
    state = expand(
        load_text(
            f"name: n\nservices:\n  - name: s\n    command: [x, {written}]\n"
            f"    env:\n      V: {written}\n"
        ),
        alloc(1),
    )
    inst = state.instance("service_s")
    assert inst.argv == ("x", written)
    assert dict(inst.env) == {"V": written}
