"""`srtr schema`: the recipe's JSON Schema, for editors and for people reading the fields."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from srtr.cli import main
from srtr.resources.recipe import Recipe, Role, Service

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """What `srtr schema` prints (module-scoped, so not through capsys)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["schema"]) == 0
    return json.loads(out.getvalue())


def test_schema_is_json_with_services(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "srtr recipe"
    assert schema["type"] == "object"
    assert schema["properties"]["services"]["type"] == "array"
    assert schema["properties"]["services"]["items"] == {"$ref": "#/$defs/Service"}
    # issue 12: `name` defaults to the file's stem, so an editor must not demand it.
    assert "required" not in schema
    assert schema["properties"]["name"]["type"] == "string"
    assert schema["additionalProperties"] is False


def test_every_recipe_field_is_in_the_schema(schema: dict[str, Any]) -> None:
    assert set(schema["properties"]) == set(Recipe.model_fields)


def test_every_service_field_is_in_the_schema(schema: dict[str, Any]) -> None:
    service = schema["$defs"]["Service"]
    assert set(service["properties"]) == set(Service.model_fields)
    assert service["required"] == ["name"]
    assert service["additionalProperties"] is False
    for field in (
        "name",
        "type",
        "command",
        "args",
        "container",
        "env",
        "placement",
        "nodes",
        "start",
        "readiness",
        "critical",
        "terminal",
        "preamble",
        "enabled",
        "options",
        "metrics",
        "restart",
        "shutdown_tier",
        "stop_grace_seconds",
    ):
        assert field in service["properties"], field


def test_every_role_field_is_in_the_schema(schema: dict[str, Any]) -> None:
    assert set(schema["$defs"]["Role"]["properties"]) == set(Role.model_fields)


def test_schema_cli_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "services" in json.loads(captured.out)["properties"]


def _validator(schema: dict[str, Any]) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("recipe", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_validate_against_the_schema(schema: dict[str, Any], recipe: Path) -> None:
    errors = list(_validator(schema).iter_errors(yaml.safe_load(recipe.read_text())))
    assert not errors, [e.message for e in errors]


def test_schema_refuses_unknown_keys(schema: dict[str, Any]) -> None:
    bad = {"name": "t", "services": [{"name": "s", "command": ["a"], "plcement": {}}]}
    assert list(_validator(schema).iter_errors(bad))


@pytest.mark.parametrize(
    "service",
    [
        {"name": "s", "command": ["a"], "restart": "on-failure"},
        {"name": "s", "command": ["a"], "metrics": {"port": 9000}},
        {"name": "s", "command": ["sleep", 1], "env": {"PORT": 8000}},
    ],
    ids=["restart-word", "metrics-mapping", "numbers"],
)
def test_schema_accepts_what_srtr_accepts(schema: dict[str, Any], service: dict) -> None:
    """The sugar srtr loads (a restart word, one metrics mapping, numbers as text) is valid."""
    recipe = {"name": "t", "services": [service]}
    Recipe.model_validate(recipe)  # srtr loads it
    errors = list(_validator(schema).iter_errors(recipe))
    assert not errors, [e.message for e in errors]
