"""The HTTP API page, rendered from an OpenAPI 3.1 document (the gateway's ``openapi_document()``).

Routes grouped by the document's tags, each with its request body, parameters and answers by status; then
every schema of ``components.schemas`` as a table of its fields. A ``$ref`` becomes a link to the schema's
section, so the page and the document cannot disagree: the page is made from the document at build time
(``docs/hooks/http_api.py``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from embedstream.docsite.markdown import cell

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
REF_PREFIX = "#/components/schemas/"


def render_openapi(doc: dict[str, Any], title: str = "HTTP API") -> str:
    """The whole page as Markdown."""
    info = doc.get("info", {})
    schemas = doc.get("components", {}).get("schemas", {})
    operations = list(_operations(doc))
    out = [f"# {title}", ""]
    if info.get("description"):
        out += [_prose(info["description"]), ""]
    served = [path for path in ("/openapi.json", "/api-doc/openapi.json") if path in doc.get("paths", {})]
    where = f"; a running gateway serves it at {', '.join(f'`GET {p}`' for p in served)}" if served else ""
    out += [f"{info.get('title', 'The API')} {info.get('version', '')}, OpenAPI {doc.get('openapi', '')}. This page is "
            f"generated from the gateway's OpenAPI document (`embedstream.gateway.openapi.openapi_document()`) when "
            f"the site is built{where}.", ""]
    out += ["## Routes", "", "| route | summary | group |", "|---|---|---|"]
    for path, method, op in operations:
        out.append(f"| [`{method.upper()} {path}`](#{_op_id(method, path)}) | {cell(op.get('summary', ''))} | "
                   f"{cell(', '.join(op.get('tags', [])))} |")
    out.append("")
    for tag, described in _tags(doc, operations):
        out += [f"## {tag}", ""]
        if described:
            out += [_prose(described), ""]
        for path, method, op in operations:
            if (op.get("tags") or ["Other"])[0] == tag:
                out += _operation(path, method, op)
    if schemas:
        out += ["## Schemas", ""]
        for name in sorted(schemas):
            out += _schema_section(name, schemas[name])
    return "\n".join(out)


def _operations(doc: dict[str, Any]):
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def _tags(doc: dict[str, Any], operations: list) -> list[tuple[str, str]]:
    """(name, description) of each tag in the document's order, then tags only operations name, then 'Other'."""
    declared = [(tag["name"], tag.get("description", "")) for tag in doc.get("tags", [])]
    used = [(op.get("tags") or ["Other"])[0] for _, _, op in operations]
    names = {name for name, _ in declared}
    extra = [(name, "") for name in dict.fromkeys(used) if name not in names]
    return [(name, text) for name, text in declared + extra if name in used]


def _op_id(method: str, path: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "root"
    return f"op-{method}-{slug}"


def _schema_id(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}` {{#{_op_id(method, path)}}}", ""]
    for key in ("summary", "description"):
        if op.get(key):
            out += [_prose(op[key]), ""]
    parameters = op.get("parameters", [])
    if parameters:
        out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in parameters:
            out.append(f"| `{p.get('name')}` | {p.get('in', '')} | {type_text(p.get('schema', {}))} | "
                       f"{'yes' if p.get('required') else 'no'} | {cell(p.get('description', ''))} |")
        out.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            need = "required" if body.get("required") else "optional"
            out += [f"Request body ({need}, `{media}`): {type_text(content.get('schema', {}))}", ""]
    responses = op.get("responses", {})
    if responses:
        out += ["| status | when | body |", "|---|---|---|"]
        for status, answer in responses.items():
            when = answer.get("description", "")
            headers = answer.get("headers", {})
            if headers:
                when += "; headers: " + ", ".join(
                    f"`{name}`" + (f" ({h['description']})" if h.get("description") else "") for name, h in headers.items())
            bodies = [f"{type_text(c.get('schema', {}))} (`{media}`)" if media != "application/json"
                      else type_text(c.get("schema", {})) for media, c in answer.get("content", {}).items()]
            out.append(f"| {status} | {cell(when)} | {'; '.join(bodies) or '-'} |")
        out.append("")
    return out


def _schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name} {{#{_schema_id(name)}}}", ""]
    if schema.get("description"):
        out += [_prose(schema["description"]), ""]
    properties = schema.get("properties")
    if properties:
        required = set(schema.get("required", []))
        out += ["| field | type | required | default | description |", "|---|---|---|---|---|"]
        for field, sub in properties.items():
            default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
            out.append(f"| `{field}` | {type_text(sub)} | {'yes' if field in required else 'no'} | {default} | "
                       f"{cell(sub.get('description', ''))} |")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out.append(f"| any other name | {type_text(extra)} | no |  |  |")
        out.append("")
    else:
        out += [f"Type: {type_text({k: v for k, v in schema.items() if k not in ('title', 'description')})}", ""]
    return out


def type_text(schema: dict[str, Any] | bool) -> str:
    """A JSON Schema as a short phrase for a table cell; ``$ref`` as a link to the schema's section."""
    if schema is True or schema == {}:
        return "any"
    if schema is False:
        return "nothing"
    assert isinstance(schema, dict)
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(REF_PREFIX)
        return f"[{name}](#{_schema_id(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [s for s in schema[key] if s != {"type": "null"}]
            text = " or ".join(type_text(s) for s in options)
            return text + " or null" if len(options) < len(schema[key]) else text
    if "allOf" in schema:
        return " and ".join(type_text(s) for s in schema["allOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(type_text({**schema, "type": k}) for k in kind)
    if kind == "array":
        text = f"array of {type_text(schema.get('items', {}))}"
    elif kind == "object":
        extra = schema.get("additionalProperties")
        text = f"object of {type_text(extra)}" if isinstance(extra, dict) else "object"
    else:
        text = str(kind or "any")
        if schema.get("format"):
            text += f" ({schema['format']})"
    return text + _bounds(schema)


_BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
           ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"), ("maxItems", "items ≤"))


def _bounds(schema: dict[str, Any]) -> str:
    parts = [f"{sign} {schema[key]}" for key, sign in _BOUNDS if key in schema]
    return f" ({', '.join(parts)})" if parts else ""


def _prose(text: str) -> str:
    """A description as a paragraph (docstrings' reST ``literals`` as Markdown code)."""
    return text.replace("``", "`").strip()
