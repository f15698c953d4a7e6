"""The file format of ``evalsite evaluators``: one YAML file per evaluator, long texts beside it.

``<dir>/<slug>.yaml`` holds ``slug``, ``name``, ``description``, ``kind``, ``parameters``,
``outputs_schema`` (only when it is not the schema the kind derives from the parameters) and
``examples``. Code and prompt texts live in sibling files that the YAML names as
``{file: <path>}`` (relative to the YAML, inside the folder). Secrets of sealed settings (a
webhook's headers) are never written: ``"••••••"`` keeps the server's value and
``{env: NAME}`` takes it from the environment at push time. A key left out of a file keeps what
the server has (a new evaluator gets the kind's defaults). docs/evaluators-as-code.md is the
user's guide; this module only reads, renders and compares, and never calls the server.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MASK = "••••••"  # what the server shows for a sealed value, and keeps when it is sent back
KEYS = ("slug", "name", "description", "kind", "parameters", "outputs_schema", "examples")
CASE_KEYS = ("name", "inputs", "outputs", "trace", "expected")
EXTENSIONS = {"python": "py", "javascript": "js", "typescript": "ts"}
SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")

Position = tuple[Any, ...]  # a place in a document: ("parameters", "messages", 0, "content")


class FormatError(Exception):
    """A local file that is not a valid evaluator file; the message names the file and place."""


# --- YAML -------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """YAML read as JSON would be: true/false are the only booleans (``yes``, ``on`` stay
    strings) and dates stay strings, so what is sent is what the file shows."""


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # List items indented under their key, as most YAML in repositories is.
        super().increase_indent(flow, False)


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line text as a block (|), so a changed line of code or prompt is a changed line.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _mapping(dumper: yaml.SafeDumper, value: dict) -> yaml.MappingNode:
    # A reference reads as one: code: {file: exact.py}, Authorization: {env: TOKEN}.
    reference = _is_file_ref(value) or _is_env_ref(value)
    return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=reference or None)


_Dumper.add_representer(str, _text)
_Dumper.add_representer(dict, _mapping)


def load_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise FormatError(f"{where}: not valid YAML: {exc}") from None


def dump_yaml(value: Any) -> str:
    return yaml.dump(
        value,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=1_000_000,
    )


def ordered(doc: dict[str, Any]) -> dict[str, Any]:
    """A document in its file order: the top-level keys and each example case in a fixed order,
    every other mapping sorted, so the same evaluator always renders the same bytes."""
    top = {key: _sorted(doc[key]) for key in KEYS if key in doc and key != "examples"}
    if "examples" in doc:
        top["examples"] = [_case(case) for case in doc["examples"]]
    return top


def _case(case: Any) -> Any:
    if not isinstance(case, dict):
        return _sorted(case)
    first = [key for key in CASE_KEYS if key in case]
    rest = sorted(key for key in case if key not in CASE_KEYS)
    return {key: _sorted(case[key]) for key in first + rest}


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def render(doc: dict[str, Any]) -> str:
    """A document as the YAML a person reads in a diff (texts inline, not as file references)."""
    return dump_yaml(ordered(doc))


# --- what the server says about kinds -----------------------------------------------------------


@dataclass
class Kinds:
    """The settings templates of the server's kinds (``GET /api/v1/kinds``)."""

    by_key: dict[str, dict[str, Any]]

    @classmethod
    def from_api(cls, kinds: list[dict[str, Any]]) -> Kinds:
        return cls({kind["key"]: kind for kind in kinds})

    def template(self, kind: str) -> dict[str, Any]:
        return (self.by_key.get(kind) or {}).get("settings_template") or {}

    def _properties(self, kind: str) -> dict[str, Any]:
        return self.template(kind).get("properties") or {}

    def sealed(self, kind: str) -> list[str]:
        return [name for name, spec in self._properties(kind).items() if spec.get("x-sealed")]

    def code_settings(self, kind: str) -> list[str]:
        return [name for name, spec in self._properties(kind).items() if _is_code(spec)]

    def outputs_schema(self, kind: str) -> dict[str, Any] | None:
        return (self.by_key.get(kind) or {}).get("outputs_schema")


def _is_code(spec: dict[str, Any]) -> bool:
    return spec.get("x-widget") == "code" and spec.get("type") == "string"


# --- local files -------------------------------------------------------------------------------


@dataclass
class Local:
    """One evaluator file, read: ``doc`` holds the keys the file gives, texts of referenced files
    read in, sealed values as written (``"••••••"``, ``{"env": NAME}`` or, discouraged, the
    value itself)."""

    path: Path
    slug: str
    doc: dict[str, Any]
    files: dict[Position, Path] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.doc["kind"]

    def file_for(self, field_name: str) -> Path | None:
        """The file a server error about ``parameters.<name>...`` is really about."""
        parts = field_name.split(".")
        for position, path in self.files.items():
            if parts[: len(position)] == [str(step) for step in position]:
                return path
        return None


def read_folder(folder: Path, kinds: Kinds) -> dict[str, Local]:
    """Every ``*.yaml`` / ``*.yml`` directly in ``folder``, by slug."""
    if not folder.is_dir():
        raise FormatError(f"{folder}: no such folder (give --dir)")
    found: dict[str, Local] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        local = read_file(path, folder, kinds)
        if local.slug in found:
            raise FormatError(f"{path}: slug {local.slug!r} is also in {found[local.slug].path}")
        found[local.slug] = local
    return found


def read_file(path: Path, folder: Path, kinds: Kinds) -> Local:
    raw = load_yaml(_read(path), str(path))
    if not isinstance(raw, dict):
        raise FormatError(f"{path}: expected a mapping with slug, name, kind, parameters, ...")
    unknown = sorted(set(map(str, raw)) - set(KEYS))
    if unknown:
        raise FormatError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    _check_json(raw, str(path), ())
    slug = raw.get("slug", path.stem)
    if not isinstance(slug, str) or not SLUG.match(slug):
        raise FormatError(f"{path}: slug must be letters, digits, - and _ (got {slug!r})")
    for key in ("name", "kind"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise FormatError(f"{path}: {key} is required (a string)")
    if raw["kind"] not in kinds.by_key:
        known = ", ".join(sorted(kinds.by_key))
        raise FormatError(f"{path}: unknown kind {raw['kind']!r}; the server knows {known}")
    _check_types(raw, path)
    doc = dict(raw, slug=slug)
    files: dict[Position, Path] = {}
    if "parameters" in doc:
        root = kinds.template(raw["kind"])
        doc["parameters"] = _read_files(
            doc["parameters"], root, root, path, folder, ("parameters",), files
        )
        _check_sealed(doc["parameters"], kinds.sealed(raw["kind"]), path)
    return Local(path=path, slug=slug, doc=doc, files=files)


def _read(path: Path) -> str:
    # newline="" keeps the bytes' line endings, so a file round-trips exactly.
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def _check_types(raw: dict[str, Any], path: Path) -> None:
    expected = {
        "description": str,
        "parameters": dict,
        "examples": list,
        "outputs_schema": (dict, type(None)),
    }
    for key, kind in expected.items():
        if key in raw and not isinstance(raw[key], kind):
            what = {dict: "a mapping", list: "a list", str: "a string"}.get(
                kind, "a mapping or null"
            )
            raise FormatError(f"{path}: {key} must be {what}")


def _check_json(value: Any, where: str, position: Position) -> None:
    """Only what JSON can carry, so what is sent is what the file shows."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FormatError(f"{where}: {_dotted(position)}: key {key!r} must be a string")
            _check_json(item, where, (*position, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, where, (*position, index))
    elif not isinstance(value, str | int | float | bool | type(None)):
        raise FormatError(f"{where}: {_dotted(position)}: {value!r} is not a JSON value")


def _dotted(position: Position) -> str:
    return ".".join(map(str, position)) or "(the file)"


def _is_file_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"file"} and isinstance(value["file"], str)


def _is_env_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str)


def _read_files(value, schema, root, path, folder, position, files):
    """Replace ``{file: ...}`` wherever the kind expects a string (its settings template says
    so), and nowhere else: a mapping that only looks like a reference stays data."""
    schema = _deref(schema, root)
    if _is_file_ref(value) and _expects_string(schema, root):
        target = _inside(path.parent / value["file"], folder, path, position)
        if not target.is_file():
            raise FormatError(f"{path}: {_dotted(position)}: no file {value['file']}")
        files[position] = target
        return _read(target)
    if isinstance(value, dict):
        properties = _branch(schema, root, "properties").get("properties") or {}
        return {
            key: _read_files(
                item, properties.get(key, {}), root, path, folder, (*position, key), files
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        items = _branch(schema, root, "items").get("items") or {}
        return [
            _read_files(item, items, root, path, folder, (*position, index), files)
            for index, item in enumerate(value)
        ]
    return value


def _deref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return (root.get("$defs") or {}).get(ref.removeprefix("#/$defs/"), {})
    return schema if isinstance(schema, dict) else {}


def _branch(schema: dict[str, Any], root: dict[str, Any], key: str) -> dict[str, Any]:
    if key in schema:
        return schema
    for option in schema.get("anyOf") or schema.get("oneOf") or []:
        option = _deref(option, root)
        if key in option:
            return option
    return {}


def _expects_string(schema: dict[str, Any], root: dict[str, Any]) -> bool:
    if schema.get("type") == "string":
        return True
    options = schema.get("anyOf") or schema.get("oneOf") or []
    return any(_deref(option, root).get("type") == "string" for option in options)


def _inside(target: Path, folder: Path, path: Path, position: Position) -> Path:
    if not target.resolve().is_relative_to(folder.resolve()):
        raise FormatError(f"{path}: {_dotted(position)}: {target} is outside {folder}")
    return target


def _check_sealed(parameters: dict[str, Any], sealed: list[str], path: Path) -> None:
    for name in sealed:
        values = parameters.get(name)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise FormatError(f"{path}: parameters.{name} must be a mapping of names to values")
        for key, value in values.items():
            if not (isinstance(value, str) or _is_env_ref(value)):
                raise FormatError(
                    f"{path}: parameters.{name}.{key}: give {MASK!r} (keep the server's value) "
                    f"or {{env: NAME}} (read it from the environment)"
                )


def secrets_in(local: Local, kinds: Kinds) -> list[tuple[str, str, Any]]:
    """(setting, name, value) of every sealed value a file gives other than ``MASK``: the
    server compares these with what it stores, the client cannot."""
    parameters = local.doc.get("parameters") or {}
    return [
        (name, key, value)
        for name in kinds.sealed(local.kind)
        for key, value in (parameters.get(name) or {}).items()
        if value != MASK
    ]


def sendable(local: Local, kinds: Kinds) -> dict[str, Any]:
    """The file's parameters as they are sent: ``{env: NAME}`` replaced by the variable's value.
    Raises ``FormatError`` naming the variable when it is not set."""
    parameters = copy.deepcopy(local.doc.get("parameters") or {})
    for name in kinds.sealed(local.kind):
        for key, value in (parameters.get(name) or {}).items():
            if _is_env_ref(value):
                if value["env"] not in os.environ:
                    raise FormatError(
                        f"{local.path}: parameters.{name}.{key}: the environment variable "
                        f"{value['env']} is not set"
                    )
                parameters[name][key] = os.environ[value["env"]]
    return parameters


# --- documents: the server's and the file's, comparable -----------------------------------------


def remote_doc(evaluator: dict[str, Any], kinds: Kinds) -> dict[str, Any]:
    """What the server's evaluator looks like as a file (texts inline): its head revision, with
    ``outputs_schema`` only when it is not the one the kind derives from the parameters."""
    head = evaluator.get("head") or {}
    doc = {
        "slug": evaluator["slug"],
        "name": evaluator["name"],
        "description": evaluator.get("description") or "",
        "kind": evaluator["kind"],
        "parameters": head.get("parameters") or {},
    }
    outputs = (head.get("schemas") or {}).get("outputs") or None
    derived = head.get("kind_outputs_schema", kinds.outputs_schema(evaluator["kind"])) or None
    if outputs != derived:
        doc["outputs_schema"] = outputs
    doc["examples"] = head.get("examples") or []
    return doc


def effective(local: Local, remote: dict[str, Any] | None, kinds: Kinds) -> dict[str, Any]:
    """What the evaluator would look like after a push, in the server's terms: keys the file
    leaves out keep the server's value; a sealed value the server has reads as ``MASK`` (the
    server decides whether a value from the environment changed it)."""
    remote = remote or {}
    given = local.doc
    parameters = {**remote.get("parameters", {}), **given.get("parameters", {})}
    for name in kinds.sealed(local.kind):
        if isinstance(parameters.get(name), dict):
            stored = {key.lower() for key in (remote.get("parameters", {}).get(name) or {})}
            parameters[name] = {
                key: MASK if key.lower() in stored else value
                for key, value in parameters[name].items()
            }
    doc = {
        "slug": local.slug,
        # The server trims both, as every text field of its API.
        "name": given["name"].strip(),
        "description": given.get("description", remote.get("description", "")).strip(),
        "kind": local.kind,
        "parameters": parameters,
    }
    if "outputs_schema" in given:
        if given["outputs_schema"]:
            doc["outputs_schema"] = given["outputs_schema"]
    elif "outputs_schema" in remote:
        doc["outputs_schema"] = remote["outputs_schema"]
    doc["examples"] = given.get("examples", remote.get("examples", []))
    return doc


REVISED = ("parameters", "outputs_schema", "examples")


def revision_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Which of the settings that make a new revision differ (parameters, outputs_schema,
    examples)."""
    return [key for key in REVISED if before.get(key) != after.get(key)]


# --- pull: a server document as files ----------------------------------------------------------


def pulled(
    doc: dict[str, Any], yaml_path: Path, folder: Path, existing: Local | None, kinds: Kinds
) -> dict[Path, str]:
    """The files that hold ``doc``: the YAML and its texts. Code goes to ``<slug>.<ext>``
    (and a judge's multi-line prompt messages to ``<slug>.<role>.<txt|jinja>``) unless the
    existing file already names another file for it; an existing ``{env: NAME}`` is kept."""
    doc = copy.deepcopy(doc)
    if existing is not None:
        _keep_env_refs(doc, existing, kinds)
    names = {
        position: path.relative_to(yaml_path.parent)
        for position, path in (existing.files if existing else {}).items()
    }
    taken = {str(name) for name in names.values()}
    texts = list(_texts(doc, kinds))
    texts += [
        (position, _get(doc, position), "")
        for position in names
        if position not in {found for found, _, _ in texts} and isinstance(_get(doc, position), str)
    ]
    out: dict[Path, str] = {}
    for position, text, default in texts:
        if position not in names:
            names[position] = Path(_unique(default, taken))
        _inside(yaml_path.parent / names[position], folder, yaml_path, position)
        _set(doc, position, {"file": names[position].as_posix()})
        out[yaml_path.parent / names[position]] = text
    return {yaml_path: dump_yaml(ordered(doc)), **out}


def _keep_env_refs(doc: dict[str, Any], existing: Local, kinds: Kinds) -> None:
    given = existing.doc.get("parameters") or {}
    for name in kinds.sealed(doc["kind"]):
        refs = {k.lower(): v for k, v in (given.get(name) or {}).items() if _is_env_ref(v)}
        values = doc["parameters"].get(name) or {}
        for key, value in values.items():
            if value == MASK and key.lower() in refs:
                values[key] = refs[key.lower()]


def _texts(doc: dict[str, Any], kinds: Kinds) -> Iterator[tuple[Position, str, str]]:
    slug, parameters = doc["slug"], doc["parameters"]
    for name in kinds.code_settings(doc["kind"]):
        text = parameters.get(name)
        if isinstance(text, str) and text.strip():
            runtime = parameters.get(f"{name}_runtime", parameters.get("runtime"))
            extension = EXTENSIONS.get(runtime, "txt")
            default = f"{slug}.{extension}" if name == "code" else f"{slug}.{name}.{extension}"
            yield ("parameters", name), text, default
    messages = parameters.get("messages")
    if isinstance(messages, list):
        extension = "jinja" if parameters.get("template_format") == "jinja2" else "txt"
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str) and "\n" in content:
                role = message.get("role") if isinstance(message.get("role"), str) else "message"
                yield (
                    ("parameters", "messages", index, "content"),
                    content,
                    f"{slug}.{role}.{extension}",
                )


def _unique(name: str, taken: set[str]) -> str:
    stem, dot, extension = name.rpartition(".")
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{stem}-{n}{dot}{extension}", n + 1
    taken.add(candidate)
    return candidate


def _get(doc: Any, position: Position) -> Any:
    for step in position:
        try:
            doc = doc[step]
        except (KeyError, IndexError, TypeError):
            return None
    return doc


def _set(doc: Any, position: Position, value: Any) -> None:
    for step in position[:-1]:
        doc = doc[step]
    doc[position[-1]] = value
