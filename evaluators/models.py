"""Evaluators, their immutable revisions, and presets."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from evalsite.models import Project
from evaluators.crypto import decrypt, encrypt


class EvaluatorQuerySet(models.QuerySet):
    def for_project(self, project: Project) -> EvaluatorQuerySet:
        return self.filter(project=project)

    def active(self) -> EvaluatorQuerySet:
        return self.filter(archived=False)

    def by_ref(self, ref: str | int) -> EvaluatorQuerySet:
        """Match an evaluator by id or slug: every lookup in evalsite accepts either."""
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isdecimal()):
            return self.filter(models.Q(pk=int(ref)) | models.Q(slug=str(ref)))
        return self.filter(slug=ref)


class Evaluator(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluators")
    slug = models.SlugField(max_length=100)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=50)
    archived = models.BooleanField(default=False)
    head = models.ForeignKey(
        "EvaluatorRevision",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The newest revision; new runs use it.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = EvaluatorQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "slug"], name="evaluator_unique_slug")
        ]
        indexes = [models.Index(fields=["project", "kind"])]

    def __str__(self) -> str:
        return self.name


class ImmutableRevision(Exception):
    pass


class EvaluatorRevision(models.Model):
    """A snapshot of an evaluator's configuration. Never edited, except that a revision stored
    without ``schemas.outputs`` may have it backfilled once (``schema_inferred_*`` say by whom)."""

    BACKFILL_FIELDS = frozenset({"schemas", "schema_inferred_at", "schema_inferred_by"})

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    evaluator = models.ForeignKey(Evaluator, on_delete=models.CASCADE, related_name="revisions")
    version = models.PositiveIntegerField()
    slug = models.SlugField(max_length=120)
    kind = models.CharField(max_length=50)
    parameters = models.JSONField(default=dict)
    schemas = models.JSONField(
        default=dict, help_text="JSON Schemas keyed parameters, inputs, outputs."
    )
    examples = models.JSONField(
        default=list,
        blank=True,
        help_text="Example cases checked at save time: inputs, outputs, trace, expected.",
    )
    examples_report = models.JSONField(
        default=list,
        blank=True,
        help_text="How each example case fared when this revision was saved.",
    )
    message = models.CharField(max_length=500, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    schema_inferred_at = models.DateTimeField(null=True, blank=True)
    schema_inferred_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["evaluator", "version"], name="revision_unique_version"
            ),
            models.UniqueConstraint(fields=["project", "slug"], name="revision_unique_slug"),
        ]

    def __str__(self) -> str:
        return self.slug

    def save(self, *args, **kwargs):
        if self.pk is not None:
            update_fields = kwargs.get("update_fields")
            if update_fields is None or not set(update_fields) <= self.BACKFILL_FIELDS:
                raise ImmutableRevision(
                    f"Revision {self.slug} is immutable; edit the evaluator to make a new revision."
                )
        super().save(*args, **kwargs)

    @property
    def outputs_schema(self) -> dict | None:
        return (self.schemas or {}).get("outputs") or None

    @property
    def reference(self) -> dict:
        """The ``{id, slug, version}`` reference that runs and annotations store."""
        return {"id": self.pk, "slug": self.slug, "version": self.version}


class Preset(models.Model):
    """Named parameter values for a kind. Built-in ones (no project) are synced from the kinds."""

    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="presets"
    )
    kind = models.CharField(max_length=50)
    slug = models.SlugField(max_length=100)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    parameters = models.JSONField(default=dict)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "slug"],
                condition=models.Q(project__isnull=True),
                name="preset_unique_builtin",
            ),
            models.UniqueConstraint(
                fields=["project", "kind", "slug"], name="preset_unique_in_project"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.name}"


class ModelConnectionQuerySet(models.QuerySet):
    def for_project(self, project: Project) -> ModelConnectionQuerySet:
        return self.filter(project=project)

    def by_ref(self, ref: str | int) -> ModelConnectionQuerySet:
        """Match by id or slug, like evaluators."""
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isdecimal()):
            return self.filter(models.Q(pk=int(ref)) | models.Q(slug=str(ref)))
        return self.filter(slug=ref)


class ModelConnection(models.Model):
    """An OpenAI-compatible chat-completions endpoint that LLM judges of a project call.

    The API key is stored encrypted (``evaluators.crypto``) and never leaves the server:
    forms and the API take it write-only, and it is only decrypted to build the HTTP client.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="model_connections")
    slug = models.SlugField(max_length=100, help_text="What judges name in their settings.")
    name = models.CharField(max_length=200)
    base_url = models.CharField(
        max_length=500, help_text="The API root, e.g. https://api.openai.com/v1."
    )
    api_key_encrypted = models.TextField(blank=True, editable=False)
    model_names = models.JSONField(
        default=list, blank=True, help_text="Model names; the first is the default."
    )
    prices = models.JSONField(
        default=dict,
        blank=True,
        help_text='USD per 1M tokens per model: {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}.',
    )
    rate_limit_rpm = models.PositiveIntegerField(
        default=600, help_text="Requests per minute across every worker; 0 means no limit."
    )
    timeout_seconds = models.FloatField(default=60.0, help_text="Per request.")
    failing_reason = models.TextField(
        blank=True, help_text="Why calls fail for everyone (a refused key); empty when healthy."
    )
    failing_since = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ModelConnectionQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "slug"], name="model_connection_unique_slug")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)

    @property
    def is_failing(self) -> bool:
        return bool(self.failing_reason)

    def set_api_key(self, raw: str) -> None:
        self.api_key_encrypted = encrypt(raw) if raw else ""

    def api_key(self) -> str:
        """The decrypted key, for building the HTTP client only."""
        return decrypt(self.api_key_encrypted) if self.api_key_encrypted else ""

    def price_of(self, model: str) -> dict[str, float] | None:
        price = (self.prices or {}).get(model)
        return price if isinstance(price, dict) else None

    def mark_failing(self, reason: str) -> None:
        """Record a failure that stops every call (online rules pause on it)."""
        now = timezone.now()
        ModelConnection.objects.filter(pk=self.pk).update(
            failing_reason=reason[:2000], failing_since=now
        )
        self.failing_reason, self.failing_since = reason[:2000], now

    def mark_healthy(self) -> None:
        if self.failing_reason:
            ModelConnection.objects.filter(pk=self.pk).update(failing_reason="", failing_since=None)
            self.failing_reason, self.failing_since = "", None


class ReliabilityRecord(models.Model):
    """How far a revision agrees with the gold labels of a human-feedback evaluator, on the
    traces both judged: figures with 95 % intervals and the number of gold items they rest on.
    Computed by the runs app (runs.review.reliability), read here and on every run page."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    revision = models.ForeignKey(
        EvaluatorRevision, on_delete=models.CASCADE, related_name="reliability_records"
    )
    gold_evaluator = models.ForeignKey(Evaluator, on_delete=models.CASCADE, related_name="+")
    output_field = models.CharField(max_length=64, help_text="The revision's output key.")
    gold_field = models.CharField(max_length=64, help_text="The gold label's field.")
    type = models.CharField(max_length=16, help_text="binary, numeric or categorical")
    items = models.PositiveIntegerField(default=0, help_text="Gold items it rests on.")
    figures = models.JSONField(default=dict)
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["revision", "gold_field"]
        constraints = [
            models.UniqueConstraint(
                fields=["revision", "gold_evaluator", "output_field", "gold_field"],
                name="reliability_unique_pairing",
            )
        ]

    def __str__(self) -> str:
        return f"{self.revision_id}.{self.output_field} vs {self.gold_field}"
