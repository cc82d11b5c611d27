"""The job's first failure: classification, the store's cause, the reason and the history."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from srtr.store import causes
from srtr.store.persist import snapshot
from srtr.store.status import Cause
from tests.controllers.test_health_in_flight import GANG
from tests.controllers.test_health_in_flight import RANKS as GANG_RANKS
from tests.support.controller_harness import Harness


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_exits_are_classified() -> None:
    assert causes.classify(0, None) is None
    assert causes.classify(1, None) == "Error"
    assert causes.classify(137, signal.SIGKILL) == "Error"
    assert causes.classify(137, signal.SIGKILL, reported="OOMKilled") == "OOMKilled"
    assert causes.classify(143, signal.SIGTERM, reported="LivenessFailed") == "LivenessFailed"
    assert causes.classify(None, None, lost=True) == "NodeLost"
    assert causes.classify(127, None) == "LaunchFailed"
    assert causes.classify(126, None) == "LaunchFailed"
    assert causes.classify(None, None) == "Error"  # unknown status: not a success
    assert causes.classify(0, None, reported="something else") is None


def _cause(**kw: object) -> Cause:
    base: dict[str, object] = dict(
        instance="service_train_node3",
        node="node3",
        attempt=0,
        at=0.0,
        reason="Error",
        exit_code=1,
        signal=None,
        message="",
        log="logs/service_train_node3.out",
        log_offset=0,
    )
    base.update(kw)
    return Cause(**base)  # type: ignore[arg-type]


def test_the_summary_names_instance_node_exit_and_class() -> None:
    text = causes.summary(_cause(exit_code=137, signal=9, reason="OOMKilled"))
    assert text.startswith("service_train_node3 on node3 at ")
    assert "killed by SIGKILL (exit code 137) (OOMKilled); see logs/service_train_node3.out" in text
    assert "exit code 1 (Error)" in causes.summary(_cause())
    assert "lost with its node (NodeLost)" in causes.summary(_cause(reason="NodeLost"))


def test_a_reason_naming_another_instance_gets_the_first_failure_appended() -> None:
    why = causes.with_first_failure("critical instance service_db on node1 failed", _cause())
    assert why.startswith("critical instance service_db on node1 failed; first failure: ")
    assert "service_train_node3 on node3" in why
    same = "service_train_node3 exited with code 1; see logs/service_train_node3.out"
    assert causes.with_first_failure(same, _cause()) == same  # names it already
    oom = causes.with_first_failure(same, _cause(reason="OOMKilled", signal=9))
    assert oom.startswith(same + "; first failure at ") and oom.endswith("OOMKilled (SIGKILL)")
    lost = _cause(reason="NodeLost", instance="service_rider_node3", exit_code=None)
    critical = "critical instance service_owner_node3 was lost with its node node3"
    assert causes.with_first_failure(critical, lost) == critical  # one loss, one failure
    # service_train_node3 is not service_train_node30
    other = "service_train_node30 exited"
    assert "first failure: service_train_node3 " in causes.with_first_failure(other, _cause())
    assert causes.with_first_failure("x", None) == "x"


def test_the_history_keeps_the_first_failure_however_many_exits_follow() -> None:
    history = [{"attempt": 0, "exit_code": 1, "reason": "Error"}]
    history += [{"attempt": i, "exit_code": 0} for i in range(1, 40)]
    kept = causes.kept_history(history)
    assert len(kept) == causes.HISTORY_KEPT
    assert kept[0] == history[0] and kept[-1] == history[-1]
    short = history[:5]
    assert causes.kept_history(short) == short


def test_a_cause_survives_its_round_trip_through_state_json() -> None:
    doc = causes.cause_doc(_cause(signal=9, exit_code=137))
    assert doc is not None and doc["signal_name"] == "SIGKILL"
    assert causes.restored_cause(doc) == _cause(signal=9, exit_code=137)
    assert causes.restored_cause({"instance": "x"}) is None
    assert causes.restored_cause(None) is None


RANKS = """
name: ranks
services:
  - name: train
    command: [sleep, inf]
    nodes: 4
    terminal: true
"""


def test_the_first_failed_rank_is_the_cause_not_the_worst_code(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RANKS, tmp_path)
        await h.settle()
        h.exit("service_train_node3", 1)  # rank 2 fails first
        await h.advance(5)
        for rank in ("node1", "node2", "node4"):  # the others abort later
            h.backend.exit(f"service_train_{rank}", 134, signal.SIGABRT)
        await h.settle()
        job = h.store.job
        assert job.phase == "Failed" and job.exit_code == 1, job
        assert job.cause is not None
        assert (job.cause.instance, job.cause.node) == ("service_train_node3", "node3")
        assert (job.cause.exit_code, job.cause.reason) == (1, "Error")
        assert "service_train_node3" in job.reason and "134" not in job.reason
        doc = snapshot(h.store, backend="fake", controller_pid=1)
        cause = doc["job"]["cause"]
        assert cause is not None and cause["instance"] == "service_train_node3"
        history = next(i for i in doc["instances"] if i["name"] == "service_train_node1")
        assert history["history"][-1]["reason"] == "Error"  # a failure, if not the first

    run(body())


TEARDOWN = """
name: td
services:
  - name: db
    command: [sleep, inf]
    critical: true
  - name: ray
    command: [sleep, inf]
    nodes: 2
"""


def test_exits_srtr_caused_are_neither_the_cause_nor_warnings(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(TEARDOWN, tmp_path)
        await h.settle()
        h.backend.exit("service_db", 137, signal.SIGKILL, reason="OOMKilled")
        await h.settle()
        job = h.store.job
        assert job.cause is not None and job.cause.reason == "OOMKilled"
        assert job.reason.endswith("OOMKilled (SIGKILL)"), job.reason
        # The members exited on the teardown's SIGTERM (143): Stopped, no warnings.
        for name in ("service_ray_node1", "service_ray_node2"):
            assert h.phase(name) == "Stopped"
            exits = [e for e in h.events if e.object == f"instance/{name}" and e.reason == "Exited"]
            assert exits and all(e.type == "Normal" for e in exits), exits
        assert job.cause.instance == "service_db"

    run(body())


RESTARTS = """
name: rs
services:
  - name: flaky
    command: [sleep, inf]
    restart: {policy: always, backoff_seconds: 1, max_restarts: 100, window_seconds: 1000}
"""


def test_restarts_keep_the_first_crash_in_the_history(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(RESTARTS, tmp_path)
        await h.settle()
        name = "service_flaky"
        h.exit(name, 3)
        await h.settle()
        await h.advance(10)
        for _ in range(30):  # clean exits after the crash: restarted, each one recorded
            h.exit(name, 0)
            await h.settle()
            await h.advance(1000)
        cause = h.store.job.cause
        assert cause is not None and (cause.exit_code, cause.attempt) == (3, 0)
        doc = snapshot(h.store, backend="fake", controller_pid=1)
        history = doc["instances"][0]["history"]
        assert history[0]["exit_code"] == 3 and history[0]["reason"] == "Error"
        assert len(history) == causes.HISTORY_KEPT

    run(body())


LIVE = """
name: live
services:
  - name: web
    command: [sleep, inf]
    restart: {policy: on-failure, backoff_seconds: 1}
"""


def test_a_liveness_stop_is_a_failure_though_srtr_sent_it(tmp_path: Path) -> None:
    probe = "    liveness: {exec: {command: [check]}, interval_seconds: 5}\n"
    recipe = LIVE.replace("    restart:", probe + "    restart:")

    async def body() -> None:
        h = Harness(recipe, tmp_path)
        await h.settle()
        name = "service_web"
        h.prober.unhealthy.add(name)  # the liveness controller stops it after 3 failures
        for _ in range(3):
            await h.advance(5)
        assert (name, signal.SIGTERM) in h.backend.signals
        await h.settle()
        cause = h.store.job.cause
        assert cause is not None and cause.reason == "LivenessFailed" and cause.instance == name
        status = h.store.status[name]
        assert status.history[-1]["reason"] == "LivenessFailed"
        exited = [e for e in h.events if e.reason == "Exited"]
        assert exited[-1].type == "Warning" and "(LivenessFailed)" in exited[-1].message

    run(body())


def test_a_pool_restarts_stops_are_neither_the_cause_nor_warnings(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GANG, tmp_path)
        await h.settle()
        h.backend.ignore_term.add(GANG_RANKS[2])
        h.exit(GANG_RANKS[1], 1)
        await h.settle()
        h.exit(GANG_RANKS[2], 1)  # it aborts on its own once its pool is restarting: no failure
        await h.settle()
        await h.advance(5)
        cause = h.store.job.cause
        assert cause is not None and cause.instance == GANG_RANKS[1] and cause.reason == "Error"
        for name in (GANG_RANKS[0], GANG_RANKS[2]):
            assert "reason" not in h.store.status[name].history[-1]
        warned = [e.object for e in h.events if e.reason == "Exited" and e.type == "Warning"]
        assert warned == [f"instance/{GANG_RANKS[1]}"]

    run(body())


def test_a_failed_gang_pool_names_the_runs_first_failure(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(GANG, tmp_path)
        await h.settle()
        h.exit(GANG_RANKS[1], 1)  # the run's first failure; then rank 0 fails every time
        for _ in range(2):  # its two pool restarts, then the pool fails
            await h.settle()
            await h.advance(10)
            h.exit(GANG_RANKS[0], 3)
        await h.settle()
        job = h.store.job
        assert job.teardown_requested and "pool train failed" in job.reason
        assert job.cause is not None and job.cause.instance == GANG_RANKS[1]
        assert job.cause.attempt == 0 and job.cause.exit_code == 1
        assert f"first failure: {GANG_RANKS[1]} on node2" in job.reason

    run(body())


def test_a_users_stop_is_no_failure(tmp_path: Path) -> None:
    async def body() -> None:
        h = Harness(LIVE, tmp_path)
        await h.settle()
        name = "service_web"
        h.store.terminating(name, at=h.clock.now())
        await h.ctx.backend.signal(name, signal.SIGTERM)
        await h.settle()
        assert h.store.job.cause is None
        assert "reason" not in h.store.status[name].history[-1]

    run(body())
