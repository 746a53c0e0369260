"""The configuration reference, generated from the settings model (``embedstream.config.Settings``).

Every setting with its environment variable (``EMBEDSTREAM_<SECTION>__<NAME>``, or ``EMBEDSTREAM_<NAME>`` at
the top level), its type and bounds, its default and its ``Field(description=...)``: read from the model
itself, so the reference cannot drift from the code. The documentation site's hook
(``docs/hooks/config_reference.py``) puts :func:`render_markdown` into the reference page at build time;
``python -m embedstream.docsite.settings_reference`` prints it.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from dataclasses import dataclass

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from embedstream.config import ModelConfig, Settings
from embedstream.docsite.markdown import cell

REGISTRY_FIELD = "models"  # the top-level dict of ModelConfig entries: documented key by key


@dataclass(frozen=True)
class SettingDoc:
    """One setting as the reference shows it."""

    env: str  # EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS, or a registry entry's JSON key
    path: str  # kafka.bootstrap_servers: where it lives on Settings (models.<name>.pooling for an entry's key)
    type: str
    default: str
    description: str | None


@dataclass(frozen=True)
class SectionDoc:
    """A table of the reference: a nested settings model, the top-level settings, or a registry entry."""

    title: str
    intro: str
    settings: tuple[SettingDoc, ...]


def sections(root: type[BaseSettings] = Settings) -> list[SectionDoc]:
    """The reference's tables in the settings model's order: top-level settings, then each section, then the
    keys of a model registry entry."""
    prefix = str(root.model_config.get("env_prefix") or "")
    delimiter = str(root.model_config.get("env_nested_delimiter") or "__")
    top: list[SettingDoc] = []
    nested: list[SectionDoc] = []
    for name, field in root.model_fields.items():
        model = _model_class(field.annotation)
        if model is not None:
            env = f"{prefix}{name}{delimiter}".upper()
            rows = tuple(_setting(f"{env}{sub.upper()}", f"{name}.{sub}", subfield)
                         for sub, subfield in model.model_fields.items())
            nested.append(SectionDoc(f"{name}: `{env}*`", _first_paragraph(model), rows))
        else:
            top.append(_setting(f"{prefix}{name}".upper(), name, field))
    registry_env = f"{prefix}{REGISTRY_FIELD}".upper()
    registry = SectionDoc(
        f"Model registry entries: the keys of `{registry_env}`",
        _first_paragraph(ModelConfig) + f" Set as JSON, e.g. `{registry_env}="
        "'{\"my-model\": {\"path\": \"/models/my-model\", \"pooling\": \"mean\"}}'`.",
        tuple(_setting(f"`{key}`", f"{REGISTRY_FIELD}.<name>.{key}", field)
              for key, field in ModelConfig.model_fields.items()),
    )
    general = SectionDoc(f"General: `{prefix.upper()}<NAME>`", "The settings outside any section.", tuple(top))
    return [general, *nested, registry]


def settings(root: type[BaseSettings] = Settings) -> list[SettingDoc]:
    """Every row of every table."""
    return [row for section in sections(root) for row in section.settings]


def render_markdown(root: type[BaseSettings] = Settings) -> str:
    """The reference as Markdown: one heading and one table per section."""
    out: list[str] = []
    for section in sections(root):
        out += [f"## {section.title}", "", cell(section.intro), "",
                "| setting | type | default | description |", "|---|---|---|---|"]
        for row in section.settings:
            env = row.env if row.env.startswith("`") else f"`{row.env}`"
            out.append(f"| {env} | {cell(row.type)} | {row.default} | {cell(row.description or '')} |")
        out.append("")
    return "\n".join(out)


def _setting(env: str, path: str, field: FieldInfo) -> SettingDoc:
    return SettingDoc(env=env, path=path, type=_type_text(field.annotation) + _bounds(field),
                      default=_default_text(field), description=field.description)


def _model_class(annotation: object) -> type[BaseModel] | None:
    return annotation if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else None


def _first_paragraph(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", SecretStr: "secret string"}


def _type_text(annotation: object) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(_type_text(a) for a in rest)
        return f"{text}, optional" if len(rest) < len(args) else text
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"JSON list of {_plural(_type_text(args[0]))}"
    if origin is tuple:
        return "JSON list [" + ", ".join(_type_text(a) for a in args) + "]"
    if origin is dict:
        if _model_class(args[1]) is ModelConfig:
            return "JSON object: name → registry entry"
        return f"JSON object of {_type_text(args[1])}"
    if annotation in _SCALARS:
        return _SCALARS[annotation]  # type: ignore[index]
    return getattr(annotation, "__name__", str(annotation))


def _plural(text: str) -> str:
    return text + "s" if text in ("integer", "number", "string", "boolean") else text


_BOUNDS = ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "≤"),
           (annotated_types.Lt, "lt", "<"))


def _bounds(field: FieldInfo) -> str:
    parts = []
    for item in field.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(item, kind):
                parts.append(f"{sign} {getattr(item, attr)}")
        if isinstance(item, annotated_types.MaxLen):
            parts.append(f"at most {item.max_length} characters")
    return f" ({', '.join(parts)})" if parts else ""


def _default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, dict) and all(isinstance(v, ModelConfig) for v in value.values()):
        return "built in: " + ", ".join(f"`{name}`" for name in value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, tuple, dict)):
        return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"
    if isinstance(value, int) and value >= 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    return f"`{value}`" if str(value) else '`""`'


def main() -> None:
    print(render_markdown())


if __name__ == "__main__":
    main()
