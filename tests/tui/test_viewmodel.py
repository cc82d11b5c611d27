"""The TUI's pure view-model: snapshot dicts in, display data out (no Textual, no clock)."""

from __future__ import annotations

from typing import Any

import pytest

from srtr.tui import viewmodel as vm

NOW = 1_800_000_000.0


def inst(name: str, **over: Any) -> dict[str, Any]:
    """One state.json instance, Running since 30 s, overridable field by field."""
    doc: dict[str, Any] = {
        "name": name,
        "service": "train",
        "kind": "owner",
        "pool": "train",
        "index": 0,
        "node": "node1",
        "node_ip": "127.0.0.2",
        "phase": "Running",
        "ready": True,
        "restarts": 0,
        "exit_code": None,
        "pid": 100,
        "step": None,
        "log": f"logs/{name}.out",
        "shutdown_tier": 0,
        "critical": False,
        "terminal": False,
        "command": ["sleep", "1000"],
        "env": {},
        "probe": None,
        "probe_message": "",
        "started_at": NOW - 30,
        "ready_at": NOW - 29,
        "stop_grace_seconds": 30.0,
        "stop_deadline": None,
        "next_start_at": None,
        "history": [],
        "conditions": [],
    }
    doc.update(over)
    return doc


def state(instances: list[dict[str, Any]], **job: Any) -> dict[str, Any]:
    return {
        "job": {
            "name": "demo",
            "backend": "local",
            "phase": "Running",
            "exit_code": None,
            "reason": "",
            "generation": 7,
            "observed_generation": 6,
            "controller_pid": 1,
            "slurm_job_id": None,
            "stage": 1,
            "stages": ["after_frontend/train", "after_frontend/watcher"],
            "started_at": NOW - 125,
            "ended_at": None,
            **job,
        },
        "nodes": [
            {"name": "node1", "ip": "127.0.0.2", "state": "pool:train"},
            {"name": "node2", "ip": "127.0.0.3", "state": "pool:train"},
            {"name": "node3", "ip": "127.0.0.4", "state": "worker"},
        ],
        "pools": [
            {
                "name": "train",
                "type": "generic",
                "nodes": ["node1", "node2"],
                "riders": ["watcher"],
                "ready": False,
            }
        ],
        "instances": instances,
        "exporters": [],
    }


POOL = [
    inst("service_train_node1"),
    inst("service_train_node2", node="node2", phase="Starting", ready=False),
    inst("service_watcher_node1", service="watcher", kind="rider"),
    inst("service_watcher_node2", service="watcher", kind="rider", node="node2", phase="Ready"),
    inst("frontend", service="frontend", kind="frontend", pool=None, node="node3"),
    inst("worker_0", service="agg", kind="worker", pool=None, node="node3", phase="Failed"),
]


# -- time ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (-3, "0s"),
        (0, "0s"),
        (42.9, "42s"),
        (119, "119s"),
        (187, "3m7s"),
        (240, "4m"),
        (17 * 60 + 5, "17m"),
        (4 * 3600 + 12 * 60, "4h12m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (12 * 86400, "12d"),
    ],
)
def test_ages_read_like_kubectl(seconds: float | None, text: str) -> None:
    assert vm.fmt_age(seconds) == text


def test_exit_text_names_the_signal() -> None:
    assert vm.fmt_exit(None) == ""
    assert vm.fmt_exit(0) == "0"
    assert vm.fmt_exit(143, 15) == "143 (SIGTERM)"
    assert vm.fmt_exit(None, 64) == "signal 64"


# -- header ----------------------------------------------------------------------------------


def test_header_shows_generations_elapsed_and_stage() -> None:
    view = vm.header(state(POOL), NOW)
    assert view.generation == "gen 7/6"
    assert view.elapsed == "2m5s"
    assert view.stage == "stage 2/2 after_frontend/watcher"
    assert view.slurm_job_id == "—"
    assert view.time_left == ""  # not on SLURM
    assert not view.controller_gone


def test_header_on_slurm_has_a_time_left_placeholder_until_known() -> None:
    unknown = vm.header(state(POOL, backend="slurm", slurm_job_id="4242"), NOW)
    assert (unknown.slurm_job_id, unknown.time_left) == ("4242", "?")
    known = vm.header(state(POOL, backend="slurm", end_time=NOW + 3700), NOW)
    assert known.time_left == "61m"


def test_header_of_an_ended_job_stops_the_clock_and_a_dead_controller_shows() -> None:
    ended = vm.header(state(POOL, phase="Succeeded", ended_at=NOW - 60), NOW + 1000)
    assert ended.elapsed == "65s"
    assert not ended.controller_gone  # a finished job's controller is meant to be gone
    assert vm.header(state(POOL), NOW, controller_alive=False).controller_gone


# -- instances table -------------------------------------------------------------------------


def test_row_cells_in_column_order() -> None:
    history = [{"attempt": 0, "exit_code": 143, "signal": 15, "at": NOW - 10, "message": ""}]
    row = vm.instance_row(inst("a", restarts=1, history=history), NOW)
    assert dict(zip(vm.COLUMN_KEYS, row.cells, strict=True)) == {
        "name": "a",
        "service": "train",
        "kind": "owner",
        "node": "node1",
        "ip": "127.0.0.2",
        "phase": "Running",
        "ready": "yes",
        "restarts": "1",
        "age": "30s",
        "exit": "143 SIGTERM",
    }


def test_a_stopped_instance_is_not_ready_whatever_its_last_flag() -> None:
    row = vm.instance_row(inst("a", phase="Stopped", ready=True), NOW)
    assert row.cells[vm.COLUMN_KEYS.index("ready")] == "no"


def test_diff_touches_only_changed_cells() -> None:
    old = vm.instance_rows(POOL, NOW)
    new_docs = [dict(d) for d in POOL[1:]] + [inst("extra")]
    new_docs[0]["phase"] = "Ready"
    new_docs[0]["ready"] = True
    new = vm.instance_rows(new_docs, NOW + 1)
    diff = vm.diff_rows(old, new)
    assert diff.added == ["extra"]
    assert diff.removed == ["service_train_node1"]
    changed = {(k, vm.COLUMN_KEYS[c]) for k, c, _ in diff.changed}
    # Every surviving row's age ticked; only node2's phase and ready flipped.
    assert ("service_train_node2", "phase") in changed
    assert ("service_train_node2", "ready") in changed
    assert {c for k, c in changed if k != "service_train_node2"} == {"age"}
    assert vm.diff_rows(new, new).empty


def test_frame_carries_what_changed_since_the_previous_frame() -> None:
    first = vm.frame(state(POOL), NOW)
    assert first.changed is None and first.grid_changes is None
    docs = [dict(d) for d in POOL]
    docs[5]["phase"] = "BackOff"
    second = vm.frame(state(docs), NOW, previous=first)
    assert second.changed == {"worker_0"}
    assert second.grid_changes is not None
    assert [(node, col) for node, col, _ in second.grid_changes] == [("node3", 1)]
    # An instance set that changed cannot be diffed by name alone: start over.
    third = vm.frame(state(docs[:-1]), NOW, previous=second)
    assert third.changed is None


def test_a_state_read_whole_rebuilds_only_the_grid_rows_of_changed_instances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A state read whole again (every document new, most equal) is compared by name: the
    grid's rows are built again for the changed instances' nodes only (and its changes
    only when read: the grid's widget draws the rows on screen from the grid itself)."""
    from srtr.tui.viewmodel import grid

    first = vm.frame(state(POOL), NOW)
    assert first.grid.rows["node1"]  # the page on screen: node1's row alone is built
    built: list[str] = []
    row = grid._row
    monkeypatch.setattr(grid, "_row", lambda node, *a: built.append(node["name"]) or row(node, *a))
    docs = [dict(d) for d in POOL]  # a whole read: equal documents, none the same object
    docs[5]["phase"] = "BackOff"
    second = vm.frame(state(docs), NOW, previous=first)
    assert second.changed == {"worker_0"}
    assert built == []
    assert second.grid_changes is not None
    assert [(node, col) for node, col, _ in second.grid_changes] == [("node3", 1)]
    assert built == ["node3", "node3"]  # its new row and its old one, no other node's
    assert dict(second.grid.rows) == dict(vm.node_grid(state(docs)).rows)


def test_sorting_is_natural_and_numeric() -> None:
    docs = [
        inst("n10", node="node10", restarts=10),
        inst("n2", node="node2", restarts=2),
        inst("n1", node="node1", restarts=0, phase="Failed"),
    ]
    rows = vm.instance_rows(docs, NOW)
    node = vm.COLUMN_KEYS.index("node")
    restarts = vm.COLUMN_KEYS.index("restarts")
    phase = vm.COLUMN_KEYS.index("phase")
    assert vm.ordered(rows, node, False) == ["n1", "n2", "n10"]
    assert vm.ordered(rows, restarts, True) == ["n10", "n2", "n1"]
    assert vm.ordered(rows, phase, True)[0] == "n1"  # most alarming first, reversed
    assert vm.ordered(rows, None, False) == ["n10", "n2", "n1"]  # state order


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", 6),
        ("watcher", 2),
        ("WATCHER node2", 1),
        ("!watcher", 4),
        ("phase=fail", 1),
        ("kind:rider !node1", 1),
        ("node=node3", 2),
        ("nothing-matches", 0),
    ],
)
def test_filter_language(query: str, expected: int) -> None:
    rows = vm.instance_rows(POOL, NOW)
    assert len(vm.filtered(rows, vm.Filter.parse(query))) == expected


def test_an_unknown_column_prefix_is_a_plain_word() -> None:
    rows = vm.instance_rows([inst("a", env={}), inst("b", node="x=y")], NOW)
    assert list(vm.filtered(rows, vm.Filter.parse("x=y"))) == ["b"]


# -- pools and the node grid -----------------------------------------------------------------


def test_pools_count_ready_owners_and_list_riders_under_them() -> None:
    (pool,) = vm.pools(state(POOL))
    assert pool.owner.text == "train 1/2 ready"
    assert pool.nodes == "node[1-2]"
    assert [r.text for r in pool.riders] == ["watcher 2/2 ready"]
    assert pool.owner.worst == "Starting"
    others = {s.name: s.text for s in vm.other_services(state(POOL))}
    assert others == {"frontend": "frontend 1/1 ready", "agg": "agg 0/1 ready"}


def test_node_grid_has_an_owner_column_and_one_per_rider() -> None:
    grid = vm.node_grid(state(POOL))
    assert grid.columns == ("owner", "watcher")
    assert list(grid.rows) == ["node1", "node2", "node3"]
    role, owner, watcher = grid.rows["node2"]
    assert role.text == "train"
    assert (owner.phase, owner.instance) == ("Starting", "service_train_node2")
    assert watcher.text == "● Ready"
    # node3 holds two non-rider instances: the worst shows, with a count.
    _, both, nobody = grid.rows["node3"]
    assert (both.text, both.instance) == ("✗ Failed +1", "worker_0")
    assert nobody == vm.EMPTY_CELL


# -- detail pane -----------------------------------------------------------------------------


def test_detail_renders_command_env_probe_and_history_newest_first() -> None:
    doc = inst(
        "svc",
        command=["python3", "-m", "http.server", "--bind", "127.0.0.2", "a b"],
        env={"TOKEN": "****", "MODE": "fast"},
        probe="http://127.0.0.2:8000/health -> 200",
        probe_message="connection refused",
        ready=False,
        restarts=2,
        history=[
            {"attempt": 0, "exit_code": 1, "signal": None, "at": NOW - 100, "message": "crash"},
            {"attempt": 1, "exit_code": 137, "signal": 9, "at": NOW - 40, "message": ""},
        ],
    )
    events = [
        {"ts": NOW - 99, "reason": "BackOff", "object": "instance/svc", "message": "in 1s"},
        {"ts": NOW - 98, "reason": "Launched", "object": "instance/other", "message": "x"},
    ]
    view = vm.detail(doc, NOW, events=events)
    assert view.command == "python3 -m http.server --bind 127.0.0.2 'a b'"
    assert view.env == [("MODE", "fast"), ("TOKEN", "****")]
    assert view.probe_state == "failing: connection refused"
    assert view.last_probe_failure == "connection refused"
    assert view.history == [
        "#1 exit 137 (SIGKILL) · 40s ago",
        "#0 exit 1 · 100s ago · crash",
    ]
    assert view.events == ["99s ago BackOff: in 1s"]


def test_last_probe_failure_is_remembered_after_the_probe_passes() -> None:
    failing = [inst("svc", probe="tcp 10.0.0.1:80", probe_message="refused", ready=False)]
    known = vm.remember_probe_failures({}, failing)
    passing = inst("svc", probe="tcp 10.0.0.1:80", probe_message="", ready=True, ready_at=NOW - 5)
    known = vm.remember_probe_failures(known, [passing])
    view = vm.detail(passing, NOW, last_probe_failure=known["svc"])
    assert view.probe_state == "passing (ready 5s ago)"
    assert view.last_probe_failure == "refused"


# -- events, teardown, plans -----------------------------------------------------------------


def test_events_newest_first_with_warnings_flagged() -> None:
    events = [
        {"ts": NOW - 9, "type": "Normal", "reason": "Launched", "object": "a", "message": ""},
        {"ts": NOW - 1, "type": "Warning", "reason": "Exited", "object": "b", "message": "1"},
    ]
    lines = vm.event_lines(events, NOW)
    assert [(line.reason, line.warning, line.age) for line in lines] == [
        ("Exited", True, "1s"),
        ("Launched", False, "9s"),
    ]
    assert len(vm.event_lines(events * 300, NOW, limit=200)) == 200


def test_teardown_lists_each_tier_with_who_is_still_stopping() -> None:
    docs = [
        inst("t0", shutdown_tier=0, phase="Stopped"),
        inst("t1a", shutdown_tier=1, phase="Terminating", stop_deadline=NOW + 12.4),
        inst("t1b", shutdown_tier=1, phase="Terminating", stop_deadline=None),
        inst("t1c", shutdown_tier=1, phase="Succeeded"),
        inst("t2", shutdown_tier=2, phase="Running"),
    ]
    assert vm.teardown(state(docs), NOW) is None  # not tearing down
    tiers = vm.teardown(state(docs, phase="TearingDown"), NOW)
    assert tiers is not None
    assert [(t.tier, t.status, t.alive, t.total) for t in tiers] == [
        (0, "done", 0, 1),
        (1, "stopping", 2, 3),
        (2, "waiting", 1, 1),
    ]
    assert [(s.name, s.remaining) for s in tiers[1].stopping] == [
        ("t1a", "12s left"),
        ("t1b", "SIGKILL sent"),
    ]
    assert tiers[2].stopping[0].remaining == "not signalled yet"


def test_plan_view_of_a_pending_edit_and_of_a_rejected_one() -> None:
    doc = state(POOL)
    assert vm.plan_view(doc) is None
    change = {"name": "service_x_node1", "service": "x", "node": "node1", "detail": "env"}
    doc["recipe"] = {
        "pending": {"add": [], "remove": [], "restart": [change], "hot": [], "summary": "1 restart"}
    }
    view = vm.plan_view(doc)
    assert view is not None and view.pending
    assert view.lines == [("yellow", "↻ restart service_x_node1 on node1: env")]
    doc["recipe"] = {"pending": None, "rejected": ["refused live: pool too large"]}
    view = vm.plan_view(doc)
    assert view is not None and not view.pending
    assert view.lines == [("red", "refused live: pool too large")]


# -- logs ------------------------------------------------------------------------------------


def marker(attempt: int) -> str:
    return f"==== srtr: svc attempt {attempt} starting on node1 at 2026-01-01T00:00:00.0Z ===="


def test_log_split_at_the_last_restart_marker() -> None:
    assert vm.split_at_last_marker("a\nb\n") == ("", "a\nb\n")
    text = f"one\n{marker(1)}\ntwo\n{marker(2)}\nthree\n"
    before, after = vm.split_at_last_marker(text)
    assert before == f"one\n{marker(1)}\ntwo\n"
    assert after == f"{marker(2)}\nthree\n"


def test_a_marker_after_an_unterminated_line_still_splits() -> None:
    before, after = vm.split_at_last_marker(f"crash without newline{marker(1)}\nnew\n")
    assert before == "crash without newline"
    assert after.startswith("==== srtr:")


def test_marker_lookalikes_do_not_split() -> None:
    text = "==== srtr: cannot start 'x': no such file ====\necho ==== srtr: fake ====\n"
    assert vm.split_at_last_marker(text) == ("", text)
    assert not vm.is_restart_marker("==== srtr: cannot start 'x' ====")
    assert vm.is_restart_marker(marker(3) + "\n")


def test_display_lines_keep_blanks_and_split_long_lines_without_losing_text() -> None:
    long = "x" * 10_000
    out = vm.display_lines(["a", "", long, "tab\there"], limit=4096)
    assert out[:2] == ["a", " "]
    pieces = out[2:5]
    assert "".join(p.removeprefix("↪ ") for p in pieces) == long
    assert out[5] == "tab\there"


def test_a_planned_restart_reads_as_a_restart_not_as_signal_15() -> None:
    from srtr.tui.viewmodel.text import last_exit

    planned = {"exit_code": None, "signal": 15, "planned": "generation 2 (command changed)"}
    inst = {"history": [planned]}
    assert last_exit(inst) == "restarted: generation 2 (command changed)"
    assert last_exit(inst, short=True) == "restarted"
    crash = {"history": [{"exit_code": None, "signal": 15}]}
    assert last_exit(crash) == "SIGTERM"
