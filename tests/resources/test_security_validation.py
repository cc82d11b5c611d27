"""Recipes that no instance could run are refused at plan time: a NUL byte in an argv or an
env, a name longer than a log file's name can hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from srtr.resources.errors import RecipeError
from srtr.resources.loading import load_text
from srtr.resources.rules import check


def _problems(text: str) -> list[str]:
    try:
        recipe = load_text(text, "r.yaml")
    except RecipeError as exc:
        return exc.lines()
    return [p.format("r.yaml") for p in check(recipe)]


@pytest.mark.parametrize(
    ("field", "where"),
    [
        ('command: ["echo", "a\\0b"]', "services[0].command[1]"),
        ('command: ["true"]\n    env: {X: "1\\0"}', "services[0].env.X"),
        ('command: ["true"]\n    args: ["\\0"]', "services[0].args[0]"),
    ],
)
def test_a_nul_byte_is_refused(field: str, where: str) -> None:
    text = f"name: n\nservices:\n  - name: a\n    {field}\n"
    problems = _problems(text)
    assert any(where in p and "NUL byte" in p for p in problems), problems


def test_an_overlong_name_is_refused_without_echoing_it() -> None:
    name = "x" * 300
    problems = _problems(f'name: n\nservices:\n  - name: {name}\n    command: ["true"]\n')
    assert len(problems) == 1 and "at most 100" in problems[0]
    assert name not in problems[0]
    assert _problems(f'name: {name}\nservices:\n  - name: a\n    command: ["true"]\n')


def test_a_name_of_100_characters_is_fine() -> None:
    assert _problems(f'name: n\nservices:\n  - name: {"y" * 100}\n    command: ["true"]\n') == []


def test_up_warns_when_a_recipe_with_secrets_is_readable_by_others(tmp_path: Path) -> None:
    from srtr.runtime.recipe_secrets import exposure

    text = (
        'name: n\nservices:\n  - name: a\n    command: ["true"]\n'
        '    env: {HF_TOKEN: "hf_abc", LEVEL: "1"}\n'
    )
    path = tmp_path / "r.yaml"
    path.write_text(text)
    recipe = load_text(text, str(path))
    path.chmod(0o644)
    warning = exposure(path, recipe)
    assert warning is not None and "HF_TOKEN" in warning and "hf_abc" not in warning
    assert "other users" in warning and "chmod 600" in warning
    path.chmod(0o600)
    assert exposure(path, recipe) is None
    plain = load_text(text.replace("HF_TOKEN", "MODEL"), str(path))
    path.chmod(0o644)
    assert exposure(path, plain) is None
