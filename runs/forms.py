"""Forms generated from an evaluator's outputs schema (the human annotation form), and the
annotation queue forms: a queue's settings, items from a run, gold into a testset, and the
review form generated from the queue's human-feedback fields."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib.auth import get_user_model

from evaluators.models import Evaluator
from runs import review
from runs.metrics import non_null_type
from runs.models import AnnotationQueue, Run, Testset

User = get_user_model()


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


# --- annotation queues ------------------------------------------------------------------------


class QueueForm(forms.Form):
    """A queue's settings; on an existing queue the evaluator (its form) is fixed."""

    name = forms.CharField(max_length=200)
    evaluator = forms.ModelChoiceField(
        queryset=Evaluator.objects.none(),
        empty_label="Choose a human-feedback evaluator",
        help_text="Its fields are the review form (its newest revision, fixed for the queue).",
    )
    reviewers_per_item = forms.IntegerField(
        min_value=1, max_value=5, initial=2, label="Reviewers per item"
    )
    blind = forms.BooleanField(
        required=False,
        initial=True,
        label="Blind review",
        help_text="Reviewers see neither the other reviews nor the automatic verdicts until "
        "they submit their own.",
    )
    min_agreement = forms.FloatField(
        min_value=0,
        max_value=1,
        initial=1.0,
        label="Minimum agreement",
        help_text="Share of reviewer pairs that agree (0 to 1); an item below it goes to an "
        "adjudicator. 1.0 sends every disagreement.",
    )
    reservation_minutes = forms.IntegerField(
        min_value=1,
        max_value=7 * 24 * 60,
        initial=15,
        label="Reservation (minutes)",
        help_text="How long an item stays with the reviewer who opened it.",
    )
    reviewers = forms.ModelMultipleChoiceField(
        queryset=User.objects.none(),
        required=False,
        widget=forms.SelectMultiple(attrs={"size": 5}),
        help_text="None chosen: every member of the project may review.",
    )
    adjudicators = forms.ModelMultipleChoiceField(
        queryset=User.objects.none(),
        required=False,
        widget=forms.SelectMultiple(attrs={"size": 5}),
        help_text="None chosen: the project's owners adjudicate.",
    )
    instructions = forms.CharField(
        required=False,
        max_length=20_000,
        widget=forms.Textarea(attrs={"rows": 8}),
        help_text="Markdown, shown beside the review form.",
    )
    feed_name = forms.CharField(
        required=False,
        max_length=300,
        label="Online feed: root span name",
        help_text="New traces whose root span has exactly this name join the queue. Empty: no feed.",
    )
    feed_percent = forms.FloatField(
        required=False,
        min_value=0,
        max_value=100,
        initial=100,
        label="Online feed: sample (%)",
        help_text="Share of the matching traces that join.",
    )

    def __init__(self, project, *args, queue: AnnotationQueue | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        members = User.objects.filter(memberships__project=project).order_by("username")
        for name in ("reviewers", "adjudicators"):
            self.fields[name].queryset = members
            self.fields[name].label_from_instance = lambda user: user.get_username()
        if queue is not None:
            del self.fields["evaluator"]  # reviews already given answer the queue's form
        else:
            self.fields["evaluator"].queryset = (
                Evaluator.objects.for_project(project)
                .active()
                .filter(kind="human", head__isnull=False)
                .order_by("name")
            )

    def settings(self) -> dict[str, Any]:
        """The service's keyword arguments (all but the evaluator)."""
        data = self.cleaned_data
        percent = data["feed_percent"]
        return {
            "name": data["name"],
            "instructions": data["instructions"],
            "reviewers_per_item": data["reviewers_per_item"],
            "blind": data["blind"],
            "min_agreement": data["min_agreement"],
            "reservation_seconds": data["reservation_minutes"] * 60,
            "reviewers": [user.get_username() for user in data["reviewers"]],
            "adjudicators": [user.get_username() for user in data["adjudicators"]],
            "trace_filter": {"name": data["feed_name"]} if data["feed_name"] else None,
            "sampling_rate": (100 if percent is None else percent) / 100,
        }

    @staticmethod
    def initial_for(queue: AnnotationQueue) -> dict[str, Any]:
        return {
            "name": queue.name,
            "instructions": queue.instructions,
            "reviewers_per_item": queue.reviewers_per_item,
            "blind": queue.blind,
            "min_agreement": queue.min_agreement,
            "reservation_minutes": max(1, round(queue.reservation_seconds / 60)),
            "reviewers": list(queue.reviewers.all()),
            "adjudicators": list(queue.adjudicators.all()),
            "feed_name": (queue.trace_filter or {}).get("name", ""),
            "feed_percent": round(queue.sampling_rate * 100, 4),
        }

    # Service field -> form field, for InvalidInput shown inline.
    ALIASES = {
        "reservation_seconds": "reservation_minutes",
        "sampling_rate": "feed_percent",
        "trace_filter": "feed_name",
        "filter": "feed_name",
        "filter.name": "feed_name",
        "slug": "name",
    }


SELECTIONS = [
    ("all", "All scenarios"),
    ("failed", "Failed: an evaluator said no (success is false)"),
    ("errors", "Errors: an evaluator or the application failed"),
    ("metric_range", "A metric in a range"),
    ("disagreement", "Two evaluators disagree"),
]


class ItemsAddForm(forms.Form):
    """Which of a run's scenarios join the queue (``review.RunSelection``)."""

    run = forms.ModelChoiceField(queryset=Run.objects.none(), empty_label="Choose a run")
    select = forms.ChoiceField(choices=SELECTIONS, initial="all", label="Scenarios")
    step = forms.CharField(
        required=False,
        max_length=200,
        help_text="Metric range and disagreement: an evaluator step key or slug.",
    )
    metric = forms.CharField(required=False, max_length=200, initial="success")
    min = forms.FloatField(required=False, label="Min")
    max = forms.FloatField(required=False, label="Max")
    step_b = forms.CharField(
        required=False, max_length=200, label="Second step", help_text="Disagreement only."
    )
    metric_b = forms.CharField(
        required=False,
        max_length=200,
        label="Second metric",
        help_text="Empty: the same metric.",
    )
    n = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=review.ITEMS_PER_ADD,
        label="Sample size",
        help_text="Empty: every selected scenario. A sample is added in a random order.",
    )
    seed = forms.IntegerField(
        required=False, initial=0, help_text="The same seed, the same sample."
    )

    def __init__(self, project, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["run"].queryset = Run.objects.for_project(project).order_by("-created_at")
        self.fields["run"].label_from_instance = lambda run: f"#{run.pk} {run.name}"

    def selection(self) -> dict[str, Any]:
        """The selection the service reads, without the fields left empty."""
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if name != "run" and value not in (None, "")
        }


class GoldTestsetForm(forms.Form):
    testset = forms.ModelChoiceField(
        queryset=Testset.objects.none(), empty_label="Choose a testset"
    )
    prefix = forms.RegexField(
        regex=r"^[A-Za-z_][A-Za-z0-9_]{0,40}$",
        initial="gold_",
        label="Column prefix",
        help_text="Each form field becomes a column <prefix><field> of a new testset version.",
        error_messages={"invalid": "Letters, digits and _, starting with a letter or _."},
    )

    def __init__(self, project, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["testset"].queryset = Testset.objects.filter(project=project).order_by("name")


SMALL_RANGE = 10  # an integer field with at most this many values is a row of radio buttons


class ReviewForm(forms.Form):
    """The review form of a queue, from its human-feedback fields: yes/no, choices and small
    integer ranges as radio buttons (numbered for the keyboard), other numbers as number inputs,
    free text as a textarea. ``outputs()`` is what the service receives."""

    prefix = "f"  # evaluator field names never contain "-": no clash with the page's own names

    def __init__(self, fields: list[dict], *args, initial_outputs: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        initial_outputs = initial_outputs or {}
        for spec in fields:
            field = self._field(spec)
            value = initial_outputs.get(spec["name"])
            if value is not None:
                field.initial = _choice_value(value) if spec["type"] == "boolean" else value
            self.fields[spec["name"]] = field

    @staticmethod
    def _field(spec: dict) -> forms.Field:
        common = {
            "required": spec.get("required", True),
            "label": spec["name"].replace("_", " ").capitalize(),
            "help_text": spec.get("description", ""),
        }
        kind, low, high = spec["type"], spec.get("min"), spec.get("max")
        if kind == "boolean":
            return forms.TypedChoiceField(
                choices=[("true", "Yes"), ("false", "No")],
                coerce=lambda value: value == "true",
                widget=forms.RadioSelect,
                **common,
            )
        if kind == "categorical":
            choices = [(choice, choice) for choice in spec.get("choices") or []]
            return forms.ChoiceField(choices=choices, widget=forms.RadioSelect, **common)
        if kind == "integer" and _small_range(low, high):
            values = range(int(low), int(high) + 1)
            return forms.TypedChoiceField(
                choices=[(str(v), str(v)) for v in values],
                coerce=int,
                widget=forms.RadioSelect,
                **common,
            )
        if kind in ("integer", "number"):
            field_class = forms.IntegerField if kind == "integer" else forms.FloatField
            attrs = {"step": "1" if kind == "integer" else "any"}
            return field_class(
                min_value=low, max_value=high, widget=forms.NumberInput(attrs=attrs), **common
            )
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), **common)

    def outputs(self) -> dict[str, Any]:
        """The answer: each field converted by its type; optional fields left empty omitted."""
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if value is not None and value != ""
        }


def _small_range(low: float | None, high: float | None) -> bool:
    if low is None or high is None or low != int(low) or high != int(high):
        return False
    return 0 <= high - low < SMALL_RANGE


def _choice_value(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value
