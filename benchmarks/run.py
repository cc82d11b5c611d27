"""Entry point: `python3 -m benchmarks.run [--only fanout,repair,...] [--quick]`.

Runs the selected scenarios in order, prints one rich table (figure, value, baseline, ratio,
target, met?) and saves it with the machine's facts to `benchmarks/results/<date>.json`.
"""

from __future__ import annotations

import argparse
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
from rich.table import Table

from benchmarks.common import BENCH, ROOT, Figure, fmt, make_context, raise_nofile

# Order matters a little: the SLURM scenarios go last (they may wait for a free cluster).
SCENARIOS = ("plan", "fanout", "repair", "live_edit", "scale", "teardown", "hollow", "slurm")


def machine() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            return ""

    load = os.getloadavg()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


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
        out.add_row(
            f.scenario,
            f.name + (f" [dim]({f.note})[/dim]" if f.note else ""),
            fmt(f.value, f.unit),
            baseline,
            fmt(f.ratio),
            f.target_text(),
            mark,
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    """A results file as the markdown table of benchmarks/README.md."""
    lines = [
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
        "--only", help=f"comma-separated scenarios (default all): {','.join(SCENARIOS)}"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--out", help="results file (default benchmarks/results/<date>.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir")
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
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    nofile = raise_nofile()
    ctx = make_context(args.quick, lambda text: console.print(f"[dim]{text}[/dim]"))
    console.print(
        f"srtr benchmarks: {', '.join(chosen)}{' (quick)' if args.quick else ''}; "
        f"scratch {ctx.scratch}; open files {nofile}"
    )
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}
    loads: dict[str, float] = {}
    started = time.time()
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
        except Exception as exc:  # one broken scenario must not lose the others' numbers
            errors[name] = "".join(traceback.format_exception(exc))
            console.print(f"[red]{name} failed:[/red] {exc!r}")
            console.print(errors[name], markup=False)
        timings[name] = round(time.monotonic() - t0, 1)

    console.rule("results")
    console.print(table(figures, "srtr vs baselines (same run, this machine)"))
    stamp = time.strftime("%Y-%m-%d", time.localtime(started))
    out = Path(args.out) if args.out else BENCH / "results" / f"{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "quick": args.quick,
        "scenarios": list(chosen),
        "machine": machine(),
        "seconds": timings,
        "loadavg_before": loads,
        "figures": [f.to_json() for f in figures],
        "errors": errors,
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
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
