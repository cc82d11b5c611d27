"""The liveness probe kinds, one attempt each, against real files and processes."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from srtr.backends.prober import ProbeRunner
from srtr.backends.probes import probe_exec, probe_heartbeat, probe_silence
from srtr.resources.objects import ProbeKind, ProbeSpec


def test_exec_passes_on_exit_0_and_says_why_otherwise(tmp_path: Path) -> None:
    ok = asyncio.run(probe_exec([sys.executable, "-c", "pass"], {}, 5))
    assert ok.ok
    code = "import os, sys; print('not yet:', os.environ['WHO']); sys.exit(3)"
    bad = asyncio.run(probe_exec([sys.executable, "-c", code], {"WHO": "rank2"}, 5))
    assert not bad.ok and "exit 3: not yet: rank2" in bad.message
    missing = asyncio.run(probe_exec([str(tmp_path / "nope")], {}, 5))
    assert not missing.ok and "cannot run" in missing.message


def test_exec_that_overstays_its_timeout_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    result = asyncio.run(probe_exec([sys.executable, "-c", code], {}, 0.5))
    assert not result.ok and "no answer within 0.5s" in result.message
    pid = int(marker.read_text())
    for _ in range(100):  # reaped by probe_exec: gone, or at most a zombie for an instant
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the timed-out probe command still runs")


def test_heartbeat_file_must_be_young_enough(tmp_path: Path) -> None:
    beat = tmp_path / "beat"
    assert not probe_heartbeat(beat, 5, time.time()).ok
    beat.write_text("x")
    now = beat.stat().st_mtime
    assert probe_heartbeat(beat, 5, now + 4).ok
    stale = probe_heartbeat(beat, 5, now + 6)
    assert not stale.ok and "(> 5s)" in stale.message


def test_log_silence_counts_from_the_last_write_or_the_first_look(tmp_path: Path) -> None:
    log = tmp_path / "x.out"
    log.write_text("hello\n")
    written = log.stat().st_mtime
    assert probe_silence(log, 10, since=written - 100, now=written + 9).ok
    quiet = probe_silence(log, 10, since=written - 100, now=written + 11)
    assert not quiet.ok and "silent for 11.0s" in quiet.message
    # an old log (the previous attempt's) is not this attempt's silence
    assert probe_silence(log, 10, since=written + 5, now=written + 11).ok


def test_runner_runs_a_liveness_exec_with_its_timeout_and_env(tmp_path: Path) -> None:
    spec = ProbeSpec(
        ProbeKind.EXEC,
        2.0,
        10.0,
        command=(sys.executable, "-c", "import os, sys; sys.exit(os.environ['CODE'] != '0')"),
    )
    runner = ProbeRunner()

    def check(code: str) -> tuple[bool, str]:
        return asyncio.run(
            runner.check(
                "x",
                spec,
                node_ip="127.0.0.1",
                attempt=0,
                log_path=tmp_path / "x.out",
                log_offset=0,
                files_dir=tmp_path,
                env={"CODE": code},
                liveness=True,
            )
        )

    assert check("0")[0]
    assert not check("1")[0]
