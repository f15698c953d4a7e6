"""Forms generated from a kind's pydantic parameters model.

The JSON Schema of the model decides the widget (string, number, integer, boolean, enum, and
JSON for lists and objects); ``x-*`` hints fold advanced fields, hide hidden ones and ask for a
code or JSON editor. Validation goes through pydantic, so the page and the API refuse the same
values with the same messages.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from evaluators.kinds.base import Kind
from evaluators.services import parameters_shown, parameters_validate, session_shape_problem

PREFIX = "p__"
RUNTIME_LABELS = {"python": "Python", "javascript": "JavaScript", "typescript": "TypeScript"}


def _resolve(schema: dict, prop: dict) -> dict:
    """Follow a $ref / anyOf-with-null so the field sees the real type."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return {
            **schema.get("$defs", {}).get(name, {}),
            **{k: v for k, v in prop.items() if k != "$ref"},
        }
    for union in ("anyOf", "oneOf"):
        if union in prop:
            options = [o for o in prop[union] if o.get("type") != "null"]
            if len(options) == 1:
                return {
                    **_resolve(schema, options[0]),
                    **{k: v for k, v in prop.items() if k != union},
                    "nullable": True,
                }
    return prop


def _field_for(name: str, prop: dict) -> forms.Field:
    label = prop.get("title") or name.replace("_", " ").capitalize()
    common = {"label": label, "help_text": prop.get("description", ""), "required": False}
    widget_hint = prop.get("x-widget", "")
    kind = prop.get("type")
    if "enum" in prop:
        return forms.ChoiceField(choices=[(v, v) for v in prop["enum"]], **common)
    if kind == "boolean":
        return forms.BooleanField(**common)
    if kind == "integer":
        return forms.IntegerField(**common)
    if kind == "number":
        return forms.FloatField(**common)
    if kind in ("array", "object") or widget_hint in ("json", "json-schema"):
        attrs = {"rows": 6, "data-editor": "json", "class": "mono"}
        return forms.CharField(widget=forms.Textarea(attrs=attrs), **common)
    if widget_hint == "code":
        attrs = {"rows": 18, "data-editor": "python", "class": "mono", "spellcheck": "false"}
        return forms.CharField(widget=forms.Textarea(attrs=attrs), strip=False, **common)
    if widget_hint == "textarea":
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), strip=False, **common)
    attrs = {"class": "mono"} if widget_hint == "regex" else {}
    return forms.CharField(widget=forms.TextInput(attrs=attrs), strip=False, **common)


class SettingsForm(forms.Form):
    """The settings of one kind. ``cleaned_parameters`` holds the validated parameters dict."""

    def __init__(self, kind: Kind, *args, initial_parameters: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind = kind
        self.schema = kind.settings_template()
        self.props: dict[str, dict] = {}
        # Sealed values (a webhook's headers) show as MASK; posted back, MASK keeps the stored one.
        initial_parameters = parameters_shown(kind.key, initial_parameters or {})
        for name, raw_prop in self.schema.get("properties", {}).items():
            prop = _resolve(self.schema, raw_prop)
            self.props[name] = prop
            field = _field_for(name, prop)
            if prop.get("x-hidden"):
                # Posted back when a page renders it (the code editor does), so a value set on
                # the page (a preset's interface version) survives the save.
                field.widget = forms.HiddenInput()
            field.advanced = bool(prop.get("x-advanced"))
            value = initial_parameters.get(name, prop.get("default"))
            if isinstance(field.widget, forms.Textarea) and not isinstance(value, str):
                value = "" if value is None else json.dumps(value, indent=2, ensure_ascii=False)
            field.initial = value
            self.fields[PREFIX + name] = field
        self.hidden_values = {
            name: initial_parameters.get(name, prop.get("default"))
            for name, prop in self.props.items()
            if prop.get("x-hidden")
        }
        self._link_code_to_runtime()

    def _link_code_to_runtime(self) -> None:
        """A ``runtime`` choice switches the language of the code editor next to it."""
        code = next((n for n, p in self.props.items() if p.get("x-widget") == "code"), None)
        runtime = self.fields.get(PREFIX + "runtime")
        if code is None or runtime is None:
            return
        code_field = self.fields[PREFIX + code]
        runtime.choices = [(v, RUNTIME_LABELS.get(v, v)) for v, _ in runtime.choices]
        runtime.widget.attrs["data-editor-language-for"] = f"id_{PREFIX}{code}"
        code_field.widget.attrs["data-editor"] = self[PREFIX + "runtime"].value() or "python"

    def basic_fields(self):
        return [f for f in self if not f.is_hidden and not getattr(f.field, "advanced", False)]

    def advanced_fields(self):
        return [f for f in self if getattr(f.field, "advanced", False)]

    def clean(self):
        data = super().clean()
        parameters: dict[str, Any] = dict(self.hidden_values)
        for key, value in list(data.items()):
            name = key.removeprefix(PREFIX)
            prop = self.props[name]
            if prop.get("x-hidden") and key not in self.data:
                continue  # the page did not render it: keep the stored value
            empty = value in ("", None) and prop.get("type") != "boolean"
            if empty and ("default" in prop or prop.get("nullable")):
                continue
            if prop.get("type") in ("array", "object") or prop.get("x-widget") in (
                "json",
                "json-schema",
            ):
                try:
                    value = jsonsafe.loads(value)
                except ValueError as exc:
                    self.add_error(key, f"Not valid JSON: {exc}")
                    continue
            parameters[name] = value
        if self.errors:
            return data
        try:
            self.cleaned_parameters = parameters_validate(self.kind, parameters).model_dump(
                mode="json"
            )
        except InvalidInput as exc:
            for field, reasons in exc.fields.items():
                target = PREFIX + field.removeprefix("parameters.").split(".")[0]
                for reason in reasons:
                    self.add_error(target if target in self.fields else None, reason)
        return data


class EvaluatorMetaForm(forms.Form):
    name = forms.CharField(max_length=200)
    slug = forms.SlugField(
        max_length=100, required=False, help_text="Leave empty to derive it from the name."
    )
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


class RevisionMessageForm(forms.Form):
    message = forms.CharField(
        max_length=500,
        required=False,
        label="What changed",
        help_text="Saved with the new revision.",
    )


class TryForm(forms.Form):
    inputs = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "data-editor": "json", "class": "mono"}),
        initial="{}",
        help_text="The testcase row: every column, ground truth included.",
    )
    outputs = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "data-editor": "json", "class": "mono"}),
        initial='""',
        help_text="The application's output: a JSON value (a string needs quotes).",
    )
    trace = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "data-editor": "json", "class": "mono"}),
        required=False,
        initial="null",
        help_text="The invocation trace (see docs/evaluators.md), or null.",
    )
    session = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "data-editor": "json", "class": "mono"}),
        required=False,
        initial="null",
        help_text='A whole session to judge instead of a trace: {"session_id", "traces": [...], '
        '"messages": [...]}, or null. With a session, outputs null means the last turn\'s.',
    )

    def _json(self, name: str):
        raw = self.cleaned_data.get(name) or ("null" if name in ("trace", "session") else "")
        try:
            return jsonsafe.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}")

    def clean_inputs(self):
        value = self._json("inputs")
        if not isinstance(value, dict):
            raise forms.ValidationError("Inputs must be a JSON object of columns.")
        return value

    def clean_outputs(self):
        return self._json("outputs")

    def clean_trace(self):
        value = self._json("trace")
        if value is not None and not isinstance(value, dict):
            raise forms.ValidationError("The trace must be a JSON object or null.")
        return value

    def clean_session(self):
        value = self._json("session")
        problem = None if value is None else session_shape_problem(value)
        if problem:
            raise forms.ValidationError(f"Not a session: {problem}.")
        return value

    def clean(self):
        data = super().clean()
        if data.get("session") is not None and data.get("trace") is not None:
            self.add_error("session", "Give a trace or a session, not both.")
        return data


class ExamplesForm(forms.Form):
    """Example cases saved with a revision and run at every save (``examples`` of the revision)."""

    examples = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "data-editor": "json", "class": "mono"}),
        required=False,
        label="Example cases",
        help_text='A JSON list of cases, each {"name", "inputs", "outputs", "trace", "expected"}; '
        'expected holds success, score, outputs or status, e.g. {"success": true}. '
        "They run every time you save; the report shows which pass.",
    )

    @classmethod
    def for_revision(cls, revision, data=None) -> ExamplesForm:
        cases = revision.examples if revision is not None else []
        return cls(data, initial={"examples": json.dumps(cases, indent=2) if cases else "[]"})

    def clean_examples(self) -> list | None:
        if "examples" not in self.data:
            return None  # not on the page: keep the head revision's cases
        raw = self.cleaned_data["examples"].strip()
        try:
            cases = jsonsafe.loads(raw) if raw else []
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}")
        if not isinstance(cases, list):
            raise forms.ValidationError("Give a JSON list of cases ([] for none).")
        return cases
