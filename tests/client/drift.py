"""The client's models against what the server says it answers: its OpenAPI schema (generated
in-process by drf-spectacular) and, for the parts the schema leaves free-form, live answers."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

PYTHON_TYPES = {
    "integer": (int,),
    "number": (float, int),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict, BaseModel),
}


def resolve(schema: dict, node: dict) -> dict:
    """A schema node with its ``$ref`` / single ``allOf`` followed (keeping its own keys)."""
    while True:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            node = {**schema["components"]["schemas"][name], **_without(node, "$ref")}
        elif len(node.get("allOf", [])) == 1:
            node = {**resolve(schema, node["allOf"][0]), **_without(node, "allOf")}
        else:
            return node


def _without(node: dict, key: str) -> dict:
    return {k: v for k, v in node.items() if k != key}


def response(schema: dict, path: str, method: str = "get", status: str = "200") -> dict:
    operation = schema["paths"][path][method]
    return resolve(schema, operation["responses"][status]["content"]["application/json"]["schema"])


def _flat(annotation) -> list:
    """The types a field admits: unions flattened, list[X] -> list, dict[...] -> dict."""
    if annotation is typing.Any:
        return [typing.Any]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _flat(arg)]
    return [origin or annotation]


def _item_model(annotation) -> type[BaseModel] | None:
    for kind in [annotation, *typing.get_args(annotation)]:
        for arg in [kind, *typing.get_args(kind)]:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def schema_drift(schema: dict, model: type[BaseModel], node: dict, where: str = "") -> list[str]:
    """Every way ``model`` disagrees with the schema ``node``: a field the schema does not have,
    a field the model requires but the schema may leave out, a null the model cannot take, a
    type it cannot take. Nested models are checked where the schema describes them; where it
    does not (free-form JSON), ``free_form`` lists them for the live checks."""
    node = resolve(schema, node)
    properties, required = node.get("properties", {}), set(node.get("required", []))
    where = where or model.__name__
    problems = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        prop = properties.get(key)
        if prop is None:
            problems.append(f"{where}.{key}: not in the schema (has: {', '.join(properties)})")
            continue
        prop = resolve(schema, prop)
        admits = _flat(field.annotation)
        if field.is_required() and key not in required:
            problems.append(f"{where}.{key}: required here, optional in the schema")
        if prop.get("nullable") and type(None) not in admits and typing.Any not in admits:
            problems.append(f"{where}.{key}: the schema allows null, the model does not")
        wanted = PYTHON_TYPES.get(prop.get("type"))
        if prop.get("enum") and not prop.get("type"):
            wanted = (str,)
        if wanted and typing.Any not in admits:
            ok = any(
                isinstance(t, type) and (t in wanted or any(issubclass(t, w) for w in wanted))
                for t in admits
            )
            if not ok:
                problems.append(f"{where}.{key}: schema type {prop['type']}, model {admits}")
        nested = _item_model(field.annotation)
        if nested is not None:
            inner = (
                resolve(schema, prop.get("items", prop)) if prop.get("type") == "array" else prop
            )
            if inner.get("properties"):
                problems += schema_drift(schema, nested, inner, f"{where}.{key}")
            else:
                FREE_FORM.add(nested.__name__)
    return problems


FREE_FORM: set[str] = set()


def live_drift(model: type[BaseModel], data: Any, where: str = "", optional=()) -> list[str]:
    """Fields of ``model`` that a live answer ``data`` (a dict, or a list of dicts whose keys
    are pooled) never carries, except the dotted paths in ``optional``."""
    items = data if isinstance(data, list) else [data]
    items = [i for i in items if isinstance(i, dict)]
    where = where or model.__name__
    problems = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{where}.{key}"
        present = [i[key] for i in items if key in i]
        if not present:
            if path not in optional:
                problems.append(f"{path}: not in the live answer")
            continue
        nested = _item_model(field.annotation)
        values = [v for p in present for v in (p if isinstance(p, list) else [p]) if v is not None]
        if nested is not None and values:  # all null here (tokens of a step without a judge)
            problems += live_drift(nested, values, path, optional)
    return problems
