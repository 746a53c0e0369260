"""The configuration reference is generated from the settings model: every setting has a description, and
every environment variable it names is one the settings read (a misspelt name would be ignored silently:
the settings allow unknown variables)."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import SecretStr, ValidationError

from embedstream.config import Settings
from embedstream.docsite.settings_reference import REGISTRY_FIELD, render_markdown, settings

PROBE = "probe-value"
ROWS = settings()


def test_every_setting_has_a_description():
    missing = [row.env for row in ROWS if not (row.description or "").strip()]
    assert missing == [], f"settings without Field(description=...): {missing}"


def test_the_reference_lists_every_setting_of_every_section():
    expected = set()
    for name, field in Settings.model_fields.items():
        section = field.annotation if isinstance(field.annotation, type) else None
        if section is not None and hasattr(section, "model_fields"):
            expected |= {f"{name}.{sub}" for sub in section.model_fields}
        else:
            expected.add(name)
    assert expected <= {row.path for row in ROWS}
    page = render_markdown()
    for row in ROWS:
        assert row.env in page


def _probe(row) -> tuple[str, str]:
    """(variable, value) that sets ``row`` to something other than its default."""
    if not row.env.startswith("EMBEDSTREAM_"):  # a key of a registry entry: inside EMBEDSTREAM_MODELS
        key = row.path.rsplit(".", 1)[1]
        entry = {"path": PROBE} if key == "path" else {"path": "somewhere", key: PROBE}
        return f"EMBEDSTREAM_{REGISTRY_FIELD.upper()}", json.dumps({"probed": entry})
    if row.type.startswith("JSON list"):
        return row.env, json.dumps([PROBE])
    if row.type.startswith("JSON object"):
        return row.env, json.dumps({PROBE: {"path": PROBE}})
    return row.env, PROBE


def _value(settings_obj: Settings, path: str):
    node = settings_obj
    for part in path.replace("<name>", "probed").split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.path)
def test_each_documented_variable_reaches_its_setting(row, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .env file
    for key in list(os.environ):
        if key.upper().startswith("EMBEDSTREAM_"):
            monkeypatch.delenv(key)
    variable, value = _probe(row)
    monkeypatch.setenv(variable, value)
    try:
        found = _value(Settings(), row.path)
    except ValidationError as exc:  # read, and refused by the field's type: the error names the field
        where = {".".join(str(part) for part in error["loc"]) for error in exc.errors()}
        path = row.path.replace("<name>", "probed")
        assert any(loc == path or loc.startswith(path + ".") for loc in where), (variable, where)
        return
    if isinstance(found, SecretStr):
        found = found.get_secret_value()
    assert PROBE in json.dumps(found, default=str), f"{variable}={value} did not reach {row.path}: {found!r}"
