"""`srtr plan` parses its command line with only the verbs defined in srtr.cli (main() skips
`up`'s, `status`'s and the others' parsers then): the result, usage errors included, must be
the full parser's."""

from __future__ import annotations

import argparse

import pytest

from srtr.cli import build_parser

ARGVS = [
    ["plan", "x.yaml"],
    ["dry-run", "x.yaml", "--nodes", "9"],
    ["plan", "x.yaml", "-o", "json", "--launcher", "agent", "--nodelist", "gpu[01-04]"],
    ["plan", "x.yaml", "--launch", "step"],  # an option abbreviated
    ["plan", "x.yaml", "--against", "run"],
    ["plan", "--", "x.yaml"],
    ["plan", "-h"],
    ["dry-run", "--help"],
    ["plan"],
    ["plan", "x.yaml", "--nodes", "0"],
    ["plan", "x.yaml", "--nodes", "2", "--nodelist", "a"],
    ["plan", "x.yaml", "-o", "yaml"],
    ["plan", "x.yaml", "--launcher", "nope"],
    ["plan", "x.yaml", "--version"],
]


def outcome(
    parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[object, ...]:
    try:
        args, extras = parser.parse_known_args(argv)
    except SystemExit as exc:
        captured = capsys.readouterr()
        return ("exit", exc.code, captured.out, captured.err)
    return ("parsed", sorted(vars(args).items(), key=lambda kv: kv[0]), extras)


@pytest.mark.parametrize("argv", ARGVS, ids=[" ".join(a) for a in ARGVS])
def test_plan_only_parser_parses_as_the_full_one(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    full = outcome(build_parser(), argv, capsys)
    assert outcome(build_parser(run_verbs=False), argv, capsys) == full
