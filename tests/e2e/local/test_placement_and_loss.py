"""Coverage the suite lacked (issue 12): placement, tiers, node loss and pool shrink, end to end.

Every test runs a real `srtr up` on the local backend and looks at real processes: their
environment in /proc, the files they write, whether they are still alive.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.e2e_util import Run, events, instance, wait_for

pytestmark = pytest.mark.e2e


def environ(pid: int) -> dict[str, str]:
    """The environment of a live process: how we know which simulated node it runs on."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def node_ip(state: dict, node: str) -> str:
    return next(n["ip"] for n in state["nodes"] if n["name"] == node)


def stop(run: Run) -> int:
    run.signal(signal.SIGINT)
    return run.finish()


def recipe(text: str, **paths: Path) -> str:
    """`text` with @NAME@ replaced by each path (recipes are full of braces, so no format())."""
    text = textwrap.dedent(text)
    for name, path in paths.items():
        text = text.replace(f"@{name.upper()}@", str(path))
    return text


# --- 1. placement.node: infra ---------------------------------------------------------------

INFRA = """
name: infra
frontend:
  type: generic
  dedicated_node: true
  command: ["sleep", "1000"]
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: 2
  - name: store
    placement: {node: infra}
    command: ["bash", "-c", "echo store on {node} {node_ip}; exec sleep 1000"]
    readiness: {log: {pattern: "store on"}, interval_seconds: 0.05}
"""


def test_infra_placement_runs_a_service_on_the_infra_node(tmp_path: Path) -> None:
    # With a dedicated frontend the infra node (the head) is the reserved node1, not the
    # first pool node: a service that landed anywhere else would show it.
    run = Run(tmp_path, INFRA)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        infra = state["carve"]["infra"]
        assert infra == "node1" and state["carve"]["pools"]["train"] == ["node2", "node3"]
        store = instance(state, "service_store")
        assert store["kind"] == "service" and store["phase"] == "Ready"
        assert (store["node"], store["node_ip"]) == (infra, node_ip(state, infra))
        env = environ(store["pid"])
        assert (env["SRTR_NODE"], env["SRTR_NODE_IP"]) == (infra, node_ip(state, infra))
        assert store["pid"] in run.leftovers()  # really running, and ours
        log = (run.run_dir / "logs" / "service_store.out").read_text()
        assert f"store on {infra} {node_ip(state, infra)}\n" in log
        assert stop(run) == 130
    finally:
        run.close()


# --- 2. dedicated nodes ---------------------------------------------------------------------

DEDICATED = {
    # the frontend on the reserved first node; the pools carve from the rest
    "frontend": """
name: ded
frontend:
  type: generic
  dedicated_node: true
  command: ["bash", "-c", "echo frontend on $SRTR_NODE; exec sleep 1000"]
  readiness: {log: {pattern: "frontend on"}, interval_seconds: 0.05}
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: 2
  - name: everywhere
    command: ["sleep", "1000"]
    placement: {node: compute}
""",
    # the benchmark client on the reserved last node
    "client": """
name: ded
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: 2
  - name: everywhere
    command: ["sleep", "1000"]
    placement: {node: compute}
benchmark:
  type: custom
  client_dedicated_node: true
  command: 'echo "client on $SRTR_NODE"; sleep 1000'
""",
}
DEDICATED_INSTANCE = {"frontend": "frontend", "client": "benchmark"}


@pytest.mark.parametrize("who", sorted(DEDICATED))
def test_a_dedicated_node_runs_its_instance_and_nothing_else(tmp_path: Path, who: str) -> None:
    run = Run(tmp_path, DEDICATED[who])
    name = DEDICATED_INSTANCE[who]
    try:
        state = run.wait_state(
            lambda s: (
                s["job"]["phase"] == "Running"
                and (run.run_dir / "logs" / f"{name}.out").exists()
                and f"{who} on" in (run.run_dir / "logs" / f"{name}.out").read_text()
            ),
            what=f"every stage up and the {who} running",
        )
        (reserved,) = state["carve"]["reserved"]
        assert reserved == ("node1" if who == "frontend" else "node3")
        assert [n["state"] for n in state["nodes"] if n["name"] == reserved] == ["dedicated"]
        dedicated = instance(state, name)
        assert dedicated["node"] == reserved
        assert environ(dedicated["pid"])["SRTR_NODE"] == reserved
        others = [i for i in state["instances"] if i["name"] != name]
        assert len(others) == 4  # train and everywhere on both pool nodes
        assert all(i["node"] != reserved for i in others)
        assert all(environ(i["pid"])["SRTR_NODE"] != reserved for i in others)
        assert stop(run) == 130
    finally:
        run.close()


def test_placement_node_dedicated_is_refused_for_a_generic_service(tmp_path: Path) -> None:
    """`placement.node: dedicated` is for infra-class kinds (etcd, nats) only (docs/recipe.md,
    Placement vocabulary)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(
        recipe("""
        name: ded
        services:
          - name: store
            command: ["sleep", "1000"]
            placement: {node: dedicated}
    """)
    )
    done = subprocess.run(
        [sys.executable, "-m", "srtr", "plan", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"{path}:6: services[0].placement.node: dedicated is only supported for infra-class "
        "kinds (etcd, nats); use head, infra, or workers for type 'generic'\n"
    )


# --- 3, 4. teardown tiers on real processes -------------------------------------------------

# Each instance notes in RECORD when SIGTERM reached it ("term") and when it is about to exit
# ("end"). Appends to one O_APPEND file are serialised by the kernel, so the file's line order
# is the order in which the events happened. The 0.3 s between the two is a slow shutdown:
# with it, signalling a tier before the previous one is gone puts a "term" before an "end".
STOPPER = """
import os, signal, sys, time

def note(word):
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{word} {os.environ['SRTR_INSTANCE']}\\n".encode())
    os.close(fd)

def on_term(signum, frame):
    note("term")
    time.sleep(0.3)
    note("end")
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
while True:
    signal.pause()
"""
# Ready only once the handler is installed, so no SIGTERM can arrive before it.
STOPPING = """\
    command: ["python3", "@SCRIPT@", "@RECORD@"]
    readiness: {log: {pattern: "^up$"}, interval_seconds: 0.05}
    stop_grace_seconds: 20
"""


def stopping_run(tmp_path: Path, services: str) -> tuple[Run, Path]:
    # The record lives in the run dir, which every simulated node shares with the host (a
    # node's other /tmp writes are its own).
    run_dir = tmp_path / "run"
    script, record = tmp_path / "stopper.py", run_dir / "stops.txt"
    script.write_text(STOPPER)
    text = textwrap.dedent(services).replace("@STOPPING@\n", STOPPING)
    return Run(tmp_path, recipe(text, script=script, record=record), run_dir=run_dir), record


def assert_stopped_by_tier(record: Path, tiers: dict[str, int]) -> list[list[str]]:
    """Every instance was signalled once and ended, and every member of a tier had ended
    before any member of the next tier was signalled. Returns the tiers' members in order."""
    lines = [line.split() for line in record.read_text().splitlines()]
    term = {name: at for at, (word, name) in enumerate(lines) if word == "term"}
    end = {name: at for at, (word, name) in enumerate(lines) if word == "end"}
    assert len(lines) == 2 * len(tiers), lines
    assert set(term) == set(end) == set(tiers), lines
    levels = sorted(set(tiers.values()))
    members = [sorted(n for n, t in tiers.items() if t == level) for level in levels]
    for lower, upper in itertools.pairwise(members):
        last_end = max(end[n] for n in lower)
        first_term = min(term[n] for n in upper)
        assert last_end < first_term, f"{upper} signalled before {lower} ended: {lines}"
    return members


TIERS = """
name: tiers
services:
  - name: app
    nodes: 2
@STOPPING@
  - name: sidecar
    placement: {pool: app}
@STOPPING@
  - name: cache
    start: before_workers
    placement: {node: compute}
@STOPPING@
  - name: db
    start: infra
    placement: {node: compute}
@STOPPING@
"""


def test_teardown_stops_three_tiers_in_ascending_order(tmp_path: Path) -> None:
    run, record = stopping_run(tmp_path, TIERS)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        tiers = {i["name"]: i["shutdown_tier"] for i in state["instances"]}
        assert stop(run) == 130
    finally:
        run.close()
    # The defaults: after_frontend 0 (riders: their owner's), before_workers 1, infra 2.
    assert tiers == {
        "service_app_node1": 0,
        "service_app_node2": 0,
        "service_sidecar_node1": 0,
        "service_sidecar_node2": 0,
        "service_cache_node1": 1,
        "service_cache_node2": 1,
        "service_db_node1": 2,
        "service_db_node2": 2,
    }
    assert_stopped_by_tier(record, tiers)
    said = [
        e["message"].split(":")[0]
        for e in events(run.run_dir)
        if e["reason"] == "TearingDown" and e["message"].startswith("tier ")
    ]
    assert said == ["tier 0", "tier 1", "tier 2"]
    assert "Killed" not in [e["reason"] for e in events(run.run_dir)]


EXPLICIT = """
name: explicit
services:
  - name: base
    start: infra
    shutdown_tier: 0
@STOPPING@
  - name: app
    nodes: 1
@STOPPING@
  - name: agent
    placement: {pool: app}
    shutdown_tier: 7
@STOPPING@
  - name: web
    shutdown_tier: 3
@STOPPING@
"""


def test_an_explicit_shutdown_tier_is_shown_and_followed(tmp_path: Path) -> None:
    # Every explicit tier goes against its default (base 2, agent 0 like its owner, web 0),
    # so teardown by the defaults would stop them in another order.
    run, record = stopping_run(tmp_path, EXPLICIT)
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        tiers = {i["name"]: i["shutdown_tier"] for i in state["instances"]}
        assert stop(run) == 130
    finally:
        run.close()
    assert tiers == {"service_base": 0, "service_app": 0, "service_web": 3, "service_agent": 7}
    members = assert_stopped_by_tier(record, tiers)
    assert members == [["service_app", "service_base"], ["service_web"], ["service_agent"]]


# --- 5. node loss --------------------------------------------------------------------------
# A simulated node cannot die by itself: the control socket's `lose-node` op fails one (the
# local backend kills its processes and reports them Lost, as the SLURM backend does for a
# node that went DOWN). What follows is srtr's real reaction.

LOSS = """
name: loss
services:
  - name: owner
    command: ["sleep", "1000"]
    nodes: 2
    critical: true
    replace_lost: {replace}
  - name: rider
    command: ["sleep", "1000"]
    placement: {{pool: owner}}
"""


def running_on(state: dict, name: str, node: str) -> bool:
    return any(
        i["name"] == name and i["node"] == node and i["phase"] == "Running"
        for i in state["instances"]
    )


def test_replace_lost_puts_the_spare_in_the_lost_nodes_place(tmp_path: Path) -> None:
    from srtr.runtime.control import send

    run = Run(tmp_path, LOSS.format(replace="true"), "--nodes", "3")
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        assert state["carve"]["spares"] == ["node3"]
        before = {i["name"]: i["pid"] for i in state["instances"]}

        assert send(run.run_dir, "lose-node", node="node2") == (
            "node node2 lost (simulated): 2 instance(s) killed"
        )
        state = run.wait_state(
            lambda s: (
                running_on(s, "service_owner_node3", "node3")
                and running_on(s, "service_rider_node3", "node3")
            ),
            what="the spare to take node2's place",
        )
        assert state["job"]["phase"] == "Running"
        assert state["carve"]["pools"]["owner"] == ["node1", "node3"]
        assert state["carve"]["lost"] == ["node2"] and state["carve"]["spares"] == []
        assert [n["state"] for n in state["nodes"]] == ["pool:owner", "lost", "pool:owner"]
        now = {i["name"]: i["pid"] for i in state["instances"]}
        assert set(now) == {
            "service_owner_node1",
            "service_rider_node1",
            "service_owner_node3",
            "service_rider_node3",
        }
        for name in ("service_owner_node1", "service_rider_node1"):
            assert now[name] == before[name]  # the surviving node is not touched
        for name in ("service_owner_node3", "service_rider_node3"):
            assert environ(now[name])["SRTR_NODE"] == "node3"
        alive = set(run.leftovers())
        assert set(now.values()) <= alive
        assert not {before["service_owner_node2"], before["service_rider_node2"]} & alive
        seen = [(e["reason"], e["object"]) for e in events(run.run_dir)]
        assert ("NodeLost", "instance/service_owner_node2") in seen
        assert ("NodeLost", "instance/service_rider_node2") in seen
        assert ("Replaced", "pool/owner") in seen
        assert stop(run) == 130
    finally:
        run.close()


def test_a_lost_critical_owner_without_replace_lost_fails_the_job(tmp_path: Path) -> None:
    from srtr.runtime.control import ControlError, send

    run = Run(tmp_path, LOSS.format(replace="false"), "--nodes", "3")
    try:
        run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        with pytest.raises(ControlError, match="no node named 'node9'"):
            send(run.run_dir, "lose-node", node="node9")
        send(run.run_dir, "lose-node", node="node2")
        assert run.finish() == 1
    finally:
        run.close()
    state = run.state()
    assert state is not None
    assert instance(state, "service_owner_node2")["phase"] == "Lost"
    assert instance(state, "service_rider_node2")["phase"] == "Lost"
    assert instance(state, "service_rider_node2")["restarts"] == 0
    assert instance(state, "service_owner_node1")["phase"] == "Stopped"
    assert state["job"]["reason"] == (
        "critical instance service_owner_node2 was lost with its node node2"
    )


def test_lose_node_also_takes_instances_adopted_after_a_crash(tmp_path: Path) -> None:
    """Adopted instances are not the new controller's children: the backend learns their
    node from their environment, so a node loss still finds them."""
    from srtr.runtime.control import send

    run = Run(tmp_path, LOSS.format(replace="false").replace("critical: true", "critical: false"))
    try:
        state = run.wait_state(
            lambda s: s["job"]["phase"] == "Running" and all(i["identity"] for i in s["instances"]),
            what="job running with identities recorded",
        )
        before = {i["name"]: i["pid"] for i in state["instances"]}
        run.proc.kill()  # kill -9 the controller; its instances wait to be adopted
        run.wait()
        second = run.adopt()
        run.wait_state(
            lambda s: s["job"]["controller_pid"] == second.pid and s["job"]["phase"] == "Running",
            what="the new controller to take over",
        )
        assert send(run.run_dir, "lose-node", node="node2") == (
            "node node2 lost (simulated): 2 instance(s) killed"
        )
        state = run.wait_state(
            lambda s: all(
                instance(s, f"service_{n}_node2")["phase"] == "Lost" for n in ("owner", "rider")
            ),
            what="node2's adopted instances lost",
        )
        assert {i["name"]: i["pid"] for i in state["instances"]} == before
        assert instance(state, "service_owner_node1")["phase"] == "Running"
        alive = set(run.leftovers())
        assert not {before["service_owner_node2"], before["service_rider_node2"]} & alive
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 130
    finally:
        run.close()
    wait_for(lambda: not run.leftovers(), 15, "every process of the run to be gone")


# --- 6. pool shrink by a live edit ----------------------------------------------------------

SHRINK = """
name: shrink
services:
  - name: train
    command: ["sleep", "1000"]
    nodes: {nodes}
  - name: watcher
    command: ["sleep", "1000"]
    placement: {{pool: train}}
"""


def save(run: Run, text: str) -> None:
    tmp = run.recipe.with_suffix(".tmp")  # write and rename, as editors do
    tmp.write_text(textwrap.dedent(text))
    tmp.replace(run.recipe)


def test_shrinking_a_pool_live_ends_the_excess_and_keeps_the_rest(tmp_path: Path) -> None:
    # 4 -> 2, not -> 1: a one-node pool's instances are named service_<name>, so shrinking to
    # one node renames, and so restarts, the instances of the node that stays.
    run = Run(tmp_path, SHRINK.format(nodes=4))
    try:
        state = run.wait_state(lambda s: s["job"]["phase"] == "Running", what="job running")
        pids = {i["name"]: i["pid"] for i in state["instances"]}
        assert len(pids) == 8 and set(run.leftovers()) >= set(pids.values())
        kept = {n: p for n, p in pids.items() if n.endswith(("_node1", "_node2"))}
        gone = {n: p for n, p in pids.items() if n not in kept}

        save(run, SHRINK.format(nodes=2))
        state = run.wait_state(
            lambda s: s["job"]["observed_generation"] == 2 and len(s["instances"]) == 4,
            what="the pool shrunk to two nodes",
        )
        assert {i["name"]: i["pid"] for i in state["instances"]} == kept
        assert all(i["phase"] == "Running" and i["restarts"] == 0 for i in state["instances"])
        assert state["carve"]["pools"]["train"] == ["node1", "node2"]
        assert state["carve"]["spares"] == ["node3", "node4"]
        alive = set(run.leftovers())
        assert set(kept.values()) <= alive
        assert not set(gone.values()) & alive  # the removed processes really ended
        removed = {e["object"] for e in events(run.run_dir) if e["reason"] == "Stopped"}
        assert removed == {f"instance/{n}" for n in gone}
        assert stop(run) == 130
    finally:
        run.close()
