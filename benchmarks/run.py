"""Entry point: `python3 -m benchmarks.run [--only fanout,repair,...] [--quick]`.

Runs the selected scenarios in order, prints one rich table (figure, value, baseline, ratio,
target, met?) and saves it with the machine's facts to `benchmarks/results/<date>.json`.

A results file describes one commit: the harness refuses to run on a tree with uncommitted
changes (`--allow-dirty` runs anyway and marks the file dirty), records the full commit, and
runs srtr from this checkout (PYTHONPATH), whatever `pip install -e` points at. Exit status:
0 when every scenario ran and every target was met, 1 when a target was missed, a scenario
was skipped or failed, 2 for a usage error or a dirty tree.
"""

from __future__ import annotations

import argparse
import compileall
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchmarks.common import BENCH, ROOT, Figure, Skip, fmt, make_context, raise_nofile

# Order matters a little: the SLURM scenarios go last (they may wait for a free cluster).
SCENARIOS = (
    "plan",
    "tui_log",
    "fanout",
    "repair",
    "live_edit",
    "scale",
    "teardown",
    "hollow",
    "tui_scale",
    "grow",
    "control",
    "handshakes",
    "health",
    "oom",
    "slurm",
    "slurm_scale",
    "slurm_status",
    "slurm_partition",
    "slurm_grow",
    "slurm_health",
)
# Run only when named in --only: minutes each, and they take the whole machine.
BY_NAME_ONLY = ("largest",)


def git(*args: str, strip: bool = True) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return ""
    return out.strip() if strip else out


def uncommitted() -> list[str]:
    """Paths that differ from HEAD (untracked ones too: a new module changes what runs),
    except results files, which the harness writes itself."""
    # Not stripped: porcelain lines start with a status column that may be a space.
    lines = git("status", "--porcelain", "--untracked-files=all", strip=False).splitlines()
    paths = [line[3:] for line in lines if line.strip()]
    return [p for p in paths if not p.startswith("benchmarks/results/")]


def pin_srtr() -> str:
    """Make every `srtr` the harness starts import this checkout, and check that it does.

    An editable install may point at another tree; PYTHONPATH comes before it on sys.path,
    and the subprocesses (srtr, its agents through `srun --export=ALL`) inherit it.
    """
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + old if old else "")
    found = subprocess.run(
        [sys.executable, "-c", "import srtr; print(srtr.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(ROOT):
        raise SystemExit(f"srtr resolves to {found}, not to this checkout {ROOT}")
    # srtr as installed: pip compiles the bytecode of what it installs, a checkout may have
    # none, and with PYTHONDONTWRITEBYTECODE=1 (set on some machines) every srtr the
    # harness starts would compile its modules again (~0.2 s of each start-up).
    compileall.compile_dir(Path(found).parent, quiet=1)
    return found


def machine(dirty: list[str]) -> dict[str, Any]:
    """The facts of the run, taken when it starts (the commit is the one that ran)."""
    load = os.getloadavg()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(dirty),
        "uncommitted": dirty,
    }


def still_clean(facts: dict[str, Any]) -> None:
    """A commit or an edit during the run makes the figures a mix: say so in the file."""
    now = git("rev-parse", "HEAD")
    changed = uncommitted()
    if now != facts["commit"] or changed != facts["uncommitted"]:
        facts["dirty"] = True
        facts["changed_during_run"] = {"head_at_end": now, "uncommitted_at_end": changed}


def table(figures: list[Figure], title: str) -> Table:
    out = Table(title=title, show_lines=False)
    for column in ("scenario", "figure", "value", "baseline", "ratio", "target", "met?"):
        out.add_column(
            column, justify="right" if column in ("value", "baseline", "ratio") else "left"
        )
    for f in figures:
        met = f.met
        mark = "-" if met is None else ("[green]yes[/green]" if met else "[red]NO[/red]")
        baseline = fmt(f.baseline, f.unit)
        if f.baseline_label and f.baseline is not None:
            baseline += f" ({f.baseline_label})"
        # Labels hold brackets ("[group:]"), which rich would take for markup.
        out.add_row(
            f.scenario,
            escape(f.name) + (f" [dim]({escape(f.note)})[/dim]" if f.note else ""),
            fmt(f.value, f.unit),
            escape(baseline),
            fmt(f.ratio),
            f.target_text(),
            mark,
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    """A results file as the markdown table of benchmarks/README.md."""
    where = doc["machine"]
    state = "clean"
    if where["dirty"]:
        changed = where.get("changed_during_run")
        parts = (
            [f"uncommitted: {', '.join(where['uncommitted'])}"] if where.get("uncommitted") else []
        )
        parts += [f"changed during the run: {changed}"] if changed else []
        state = "DIRTY tree" + (f": {'; '.join(parts)}" if parts else "")
    lines = [
        f"Commit {where['commit']} ({state}); {doc['date']}; load average at start "
        f"{where['loadavg_at_start']}."
        + (f" Skipped: {', '.join(doc['skipped'])}." if doc.get("skipped") else "")
        + (f" Failed: {', '.join(doc['errors'])}." if doc.get("errors") else ""),
        "",
        "| scenario | figure | value | baseline | ratio | target | met? |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for f in doc["figures"]:
        unit = f["unit"]
        baseline = fmt(f["baseline"], unit)
        if f["baseline_label"] and f["baseline"] is not None:
            baseline += f" ({f['baseline_label']})"
        name = f["name"] + (f" ({f['note']})" if f["note"] else "")
        met = "-" if f["met"] is None else ("yes" if f["met"] else "**no**")
        lines.append(
            f"| {f['scenario']} | {name.replace('|', '/')} | {fmt(f['value'], unit)} | {baseline} "
            f"| {fmt(f['ratio'])} | {f['target_text']} | {met} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.run", description=__doc__)
    parser.add_argument(
        "--only",
        help=f"comma-separated scenarios (default all): {','.join(SCENARIOS)}; "
        f"by name only: {','.join(BY_NAME_ONLY)}",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--out", help="results file (default benchmarks/results/<date>.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run on a tree with uncommitted changes; the results file is marked dirty",
    )
    parser.add_argument(
        "--markdown",
        metavar="RESULTS",
        help="print a results file as a markdown table; run nothing",
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text(encoding="utf-8"))))
        return 0
    chosen = SCENARIOS if not args.only else tuple(s.strip() for s in args.only.split(","))
    known = SCENARIOS + BY_NAME_ONLY
    unknown = [s for s in chosen if s not in known]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(known)}")

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    dirty = uncommitted()
    if dirty and not args.allow_dirty:
        console.print(
            f"[red]uncommitted changes in {ROOT}[/red]: {', '.join(dirty[:10])}\n"
            "A results file must describe one commit: commit or `git stash -u` them, or run "
            "from a fresh clone (`git clone . /tmp/srtr-clean && cd /tmp/srtr-clean`); "
            "--allow-dirty runs anyway and marks the file dirty."
        )
        return 2
    srtr_file = pin_srtr()
    facts = machine(dirty)
    nofile = raise_nofile()
    ctx = make_context(args.quick, lambda text: console.print(f"[dim]{escape(text)}[/dim]"))
    console.print(
        f"srtr benchmarks: {', '.join(chosen)}{' (quick)' if args.quick else ''}; "
        f"scratch {ctx.scratch}; open files {nofile}; srtr from {Path(srtr_file).parent}; "
        f"commit {git('rev-parse', '--short', 'HEAD')}"
        + (" [red](DIRTY tree)[/red]" if dirty else "")
    )
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    timings: dict[str, float] = {}
    loads: dict[str, float] = {}
    started = time.time()
    try:
        for name in chosen:
            console.rule(name)
            loads[name] = round(os.getloadavg()[0], 2)
            if loads[name] > 0.8:
                console.print(
                    f"[yellow]load average {loads[name]} before {name}: other work is running; "
                    "figures will be noisy[/yellow]"
                )
            t0 = time.monotonic()
            try:
                module = importlib.import_module(f"benchmarks.{name}")
                got = module.run(ctx)
                figures += got
                console.print(table(got, name))
            except Skip as exc:
                skipped[name] = str(exc)
                console.print(f"[red]{name} skipped[/red]: {exc}")
            except Exception as exc:  # one broken scenario must not lose the others' numbers
                errors[name] = "".join(traceback.format_exception(exc))
                console.print(f"[red]{name} failed:[/red] {exc!r}")
                console.print(errors[name], markup=False)
            timings[name] = round(time.monotonic() - t0, 1)
    finally:
        for cleanup in reversed(ctx.cleanups):
            try:
                cleanup()
            except Exception as exc:  # a failed cleanup must not hide the results
                console.print(f"[red]cleanup failed:[/red] {exc!r}")

    console.rule("results")
    still_clean(facts)
    title = "srtr vs baselines (same run, this machine)" + (
        " [DIRTY tree]" if facts["dirty"] else ""
    )
    console.print(table(figures, title))
    stamp = time.strftime("%Y-%m-%d", time.localtime(started))
    stamp += "-dirty" if facts["dirty"] else ""
    out = Path(args.out) if args.out else BENCH / "results" / f"{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "quick": args.quick,
        "scenarios": list(chosen),
        "machine": facts,
        "seconds": timings,
        "loadavg_before": loads,
        "figures": [f.to_json() for f in figures],
        "errors": errors,
        "skipped": skipped,
    }
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    console.print(f"saved {out}")
    if not args.keep:
        shutil.rmtree(ctx.scratch, ignore_errors=True)
    missed = [f for f in figures if f.met is False]
    if missed:
        console.print(
            f"[red]{len(missed)} target(s) missed[/red]: "
            + "; ".join(f"{f.scenario}: {f.name}" for f in missed)
        )
    for name, why in skipped.items():
        console.print(f"[red]skipped[/red] {name}: {why}")
    for name in errors:
        console.print(f"[red]failed[/red] {name} (traceback above and in the results file)")
    return 1 if errors or skipped or missed else 0


if __name__ == "__main__":
    sys.exit(main())
