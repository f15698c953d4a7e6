"""Forms generated from an evaluator's outputs schema (the human annotation form)."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from runs.metrics import non_null_type


class AnnotationForm(forms.Form):
    """number with min/max -> a slider and a number; boolean -> a toggle; enum -> a choice;
    string -> text; objects and arrays -> JSON."""

    def __init__(self, schema: dict, *args, initial_outputs: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.schema = schema or {"type": "object", "properties": {}}
        required = set(self.schema.get("required", []))
        initial_outputs = initial_outputs or {}
        for name, prop in (self.schema.get("properties") or {}).items():
            field = self._field(prop, required=name in required)
            value = initial_outputs.get(name)
            field.initial = (
                json.dumps(value)
                if isinstance(field.widget, forms.Textarea) and value is not None
                else value
            )
            self.fields[name] = field

    @staticmethod
    def _field(prop: dict, *, required: bool) -> forms.Field:
        kind = non_null_type(prop)
        common = {
            "required": required and kind != "boolean",
            "help_text": prop.get("description", ""),
            "label": prop.get("title"),
        }
        if prop.get("enum"):
            choices = [(v, v) for v in prop["enum"] if v is not None]
            return forms.ChoiceField(choices=[("", "—"), *choices], **common)
        if kind == "boolean":
            return forms.BooleanField(
                widget=forms.CheckboxInput(attrs={"role": "switch"}), **common
            )
        if kind in ("number", "integer"):
            attrs: dict[str, Any] = {"step": "1" if kind == "integer" else "any"}
            low, high = prop.get("minimum"), prop.get("maximum")
            if low is not None and high is not None:
                attrs.update({"type": "range", "min": low, "max": high, "data-show-value": "true"})
                attrs["step"] = "1" if kind == "integer" else str((high - low) / 100)
            field_class = forms.IntegerField if kind == "integer" else forms.FloatField
            return field_class(
                min_value=low, max_value=high, widget=forms.NumberInput(attrs=attrs), **common
            )
        if kind in ("object", "array"):
            return forms.CharField(
                widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}), **common
            )
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), **common)

    def outputs(self) -> dict[str, Any]:
        out = {}
        for name, value in self.cleaned_data.items():
            if value in (None, "") and not isinstance(value, bool):
                continue
            if isinstance(self.fields[name].widget, forms.Textarea) and non_null_type(
                self.schema["properties"][name]
            ) in ("object", "array"):
                try:
                    value = json.loads(value)
                except ValueError:
                    self.add_error(name, "Not valid JSON.")
                    continue
            out[name] = value
        return out
