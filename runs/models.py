"""Testsets, traces, applications, runs, scenarios, results, annotations, metrics, online rules,
annotation queues (items, reviews) and judge alignments."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q
from django.utils import timezone

from evalsite.models import Project
from evaluators.crypto import secrets_mask


class ProjectQuerySet(models.QuerySet):
    def for_project(self, project: Project):
        return self.filter(project=project)


# --- testsets ---------------------------------------------------------------------------------


class Testset(models.Model):
    __test__ = False  # not a pytest test class, despite the name
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="testsets")
    slug = models.SlugField(max_length=100)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    head = models.ForeignKey(
        "TestsetVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "slug"], name="testset_unique_slug")
        ]

    def __str__(self) -> str:
        return self.name


class TestsetVersion(models.Model):
    """An immutable table of rows. Editing a testset makes a new version; runs record theirs."""

    __test__ = False  # not a pytest test class, despite the name

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    testset = models.ForeignKey(Testset, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    columns = models.JSONField(default=list, help_text="Column names in display order.")
    row_count = models.PositiveIntegerField(default=0)
    message = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.UniqueConstraint(fields=["testset", "version"], name="testset_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.testset.slug} v{self.version}"

    @property
    def slug(self) -> str:
        return f"{self.testset.slug}-v{self.version}"


class Testcase(models.Model):
    """One row: any JSON object (columns such as country, correct_answer; nested JSON kept)."""

    __test__ = False  # not a pytest test class, despite the name

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(TestsetVersion, on_delete=models.CASCADE, related_name="testcases")
    index = models.PositiveIntegerField()
    data = models.JSONField(default=dict)

    class Meta:
        ordering = ["index"]
        constraints = [
            models.UniqueConstraint(fields=["version", "index"], name="testcase_unique_index")
        ]

    def __str__(self) -> str:
        return f"row {self.index}"


# --- traces -----------------------------------------------------------------------------------


class Trace(models.Model):
    """One invocation. Spans hold the tree; the summary columns serve lists and filters."""

    # Its own index would be one more written per trace ingested: every index below starts with
    # the project.
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="traces", db_index=False
    )
    trace_id = models.CharField(max_length=64)
    name = models.CharField(max_length=300, blank=True, help_text="The root span's name.")
    root_span_id = models.CharField(max_length=64, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=16, default="ok")
    tokens = models.FloatField(null=True, blank=True)
    cost = models.FloatField(null=True, blank=True)
    span_count = models.PositiveIntegerField(default=0)
    source = models.CharField(
        max_length=16, default="api", help_text="api, otlp, invocation (recorded by a run), judge"
    )
    session_id = models.CharField(
        max_length=200,
        blank=True,
        help_text="session.id, gen_ai.conversation.id or the native session_id of its spans.",
    )
    created_at = models.DateTimeField(
        default=timezone.now,
        help_text="When its first span arrived: its spans' partition key (Span.trace_time).",
    )
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["-start_time", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "trace_id"], name="trace_unique_id")
        ]
        indexes = [
            models.Index(fields=["project", "-start_time"]),
            models.Index(fields=["project", "name"]),
            models.Index(
                fields=["project", "session_id", "start_time"],
                condition=~Q(session_id=""),
                name="trace_session",
            ),
            # Retention finds a project's traces older than its cutoff by this.
            models.Index(fields=["project", "created_at"], name="trace_created"),
        ]

    def __str__(self) -> str:
        return self.trace_id


class Span(models.Model):
    # Neither a database constraint (checking it cost every ingested span ~3 µs of commit) nor
    # an index (a tenth of PostgreSQL's work per span ingested, migration 0015): a project's
    # spans go with its traces, through the trace key below.
    project = models.ForeignKey(
        Project, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False, db_index=False
    )
    # No foreign key in the database: with daily partitions, every trace deleted made PostgreSQL
    # probe every partition for spans, and every span inserted paid a lookup. Deleting a trace
    # still takes its spans (Django's collector; retention deletes them first, in SQL). Its
    # index is span_unique_id's first column.
    trace = models.ForeignKey(
        Trace, on_delete=models.CASCADE, related_name="spans", db_constraint=False, db_index=False
    )
    span_id = models.CharField(max_length=64)
    parent_id = models.CharField(max_length=64, blank=True, help_text="Empty for a root span.")
    name = models.CharField(max_length=300)
    kind = models.CharField(max_length=32, default="task")
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, default="ok")
    status_message = models.TextField(blank=True)
    attributes = models.JSONField(
        default=dict, help_text='{"ag": {"data", "metrics": {"unit", "acc"}, "meta"}, ...otel}'
    )
    trace_time = models.DateTimeField(
        default=timezone.now,
        help_text="Its trace's created_at: the partition key, the same for every span of a trace.",
    )

    class Meta:
        ordering = ["start_time", "id"]
        # The partition key is part of every unique key of a partitioned table; trace_time is
        # the same for all spans of a trace, so this is still one row per (trace, span_id).
        constraints = [
            models.UniqueConstraint(
                fields=["trace", "span_id", "trace_time"], name="span_unique_id"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.span_id})"


class Session(models.Model):
    """The traces sharing a session id, summed up; refreshed from the traces on every ingest."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sessions")
    session_id = models.CharField(max_length=200)
    trace_count = models.PositiveIntegerField(default=0)
    start_time = models.DateTimeField(null=True, blank=True)
    last_activity = models.DateTimeField(
        null=True, blank=True, help_text="The latest end (or start) among its traces."
    )
    duration_ms = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=16, default="ok")
    tokens = models.FloatField(null=True, blank=True)
    cost = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["-last_activity", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "session_id"], name="session_unique_id")
        ]
        indexes = [
            models.Index(fields=["project", "-last_activity"]),
            # Session rules find the sessions nothing arrived for since a moment (server time).
            models.Index(fields=["project", "updated_at"], name="session_arrival"),
        ]

    def __str__(self) -> str:
        return self.session_id


# --- applications -----------------------------------------------------------------------------


class Application(models.Model):
    class Kind(models.TextChoices):
        COLUMN = "column", "Outputs in a testset column"
        LOGGED = "logged", "Outputs logged through the API"
        HTTP = "http", "HTTP endpoint"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="applications")
    slug = models.SlugField(max_length=100)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    config = models.JSONField(
        default=dict, help_text="column: {outputs_column}; http: {url, headers, timeout, ...}"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "slug"], name="application_unique_slug")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def config_shown(self) -> dict:
        """The config as people see it: header values are sealed and write-only."""
        if not self.config.get("headers"):
            return self.config
        return {**self.config, "headers": secrets_mask(self.config["headers"])}


# --- runs -------------------------------------------------------------------------------------


class RunStatus(models.TextChoices):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    ERRORS = "errors"
    FAILURE = "failure"
    CANCELLED = "cancelled"


ACTIVE_RUN_STATUSES = (RunStatus.PENDING, RunStatus.QUEUED, RunStatus.RUNNING)


class RunQuerySet(ProjectQuerySet):
    def active(self):
        return self.filter(status__in=ACTIVE_RUN_STATUSES)


class Run(models.Model):
    """A testset version (or a trace query) x an application x evaluator revisions x repeats."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    is_online = models.BooleanField(default=False)
    testset_version = models.ForeignKey(
        TestsetVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    application = models.ForeignKey(
        Application, null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    query = models.JSONField(default=dict, blank=True, help_text="Online runs: the trace filter.")
    repeats = models.PositiveSmallIntegerField(default=1)
    mappings = models.JSONField(
        default=list,
        blank=True,
        help_text="Scenario-table columns: [{column: {kind, name}, step: {key, path}}].",
    )
    total_cells = models.PositiveIntegerField(default=0)
    done_cells = models.PositiveIntegerField(default=0)
    error_cells = models.PositiveIntegerField(default=0)
    scenario_count = models.PositiveIntegerField(default=0)
    closed = models.BooleanField(default=False)
    error = models.JSONField(null=True, blank=True, help_text="Why the run failed as a whole.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    progressed_at = models.DateTimeField(
        null=True, blank=True, help_text="Last time a cell finished; the stall sweeper reads it."
    )
    metrics_refreshed_at = models.DateTimeField(null=True, blank=True)
    tags = models.JSONField(
        default=dict,
        blank=True,
        help_text='Free-form labels, name -> text: {"branch": "main", "commit": "9f1c2e7", '
        '"pr": "482"}. Runs are filtered by them (a gate finds its baseline this way).',
    )
    max_cost_usd = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="The run's spend cap: a run whose projected cost is over it is refused.",
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["project", "-created_at"]),
            models.Index(fields=["status"]),
            GinIndex(fields=["tags"], name="run_tags_gin", opclasses=["jsonb_path_ops"]),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_RUN_STATUSES

    @property
    def read_model_current(self) -> bool:
        """Its read model (``ScenarioValue``, ``RunMetrics``) was refreshed since its last cell
        landed: every refresh (debounced after cells land, at a run's end, after a schema
        backfill) ends with the run-wide one, which stamps ``metrics_refreshed_at``."""
        refreshed = self.metrics_refreshed_at
        return refreshed is not None and (
            self.progressed_at is None or self.progressed_at <= refreshed
        )

    @property
    def spend_cap_usd(self) -> float | None:
        """The binding spend cap of the run's judge calls: the lower of its own and its
        project's cap per run (None: no cap). Checked up front and kept while it runs."""
        caps = [c for c in (self.max_cost_usd, self.project.max_run_cost_usd) if c is not None]
        return float(min(caps)) if caps else None

    @property
    def progress(self) -> float:
        return 100.0 * self.done_cells / self.total_cells if self.total_cells else 0.0

    @property
    def duration_s(self) -> float | None:
        if not self.started_at:
            return None
        return ((self.finished_at or timezone.now()) - self.started_at).total_seconds()


class StepType(models.TextChoices):
    INPUT = "input"
    INVOCATION = "invocation"
    ANNOTATION = "annotation"


class RunStep(models.Model):
    """A column family of the run: ``testset-<slug>``, ``application-<slug>``,
    ``evaluator-<revision slug>``, each with references ``{id, slug, version}``."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    key = models.CharField(max_length=200)
    type = models.CharField(max_length=16, choices=StepType.choices)
    position = models.PositiveSmallIntegerField(default=0)
    references = models.JSONField(default=dict)
    revision = models.ForeignKey(
        "evaluators.EvaluatorRevision",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="run_steps",
    )

    class Meta:
        ordering = ["position", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="runstep_unique_key")]

    def __str__(self) -> str:
        return self.key


class Lane(models.TextChoices):
    """Which queue computes a unit: cheap kinds and the application calls, sandboxed code (with
    the ``celery`` code runner), or model calls (LLM judges) in a pool made for waiting."""

    RUNS = "runs"
    CODE = "code"
    LLM = "llm"
    INGEST = "ingest"


class UnitStatus(models.TextChoices):
    WAITING = "waiting"  # for the runs-lane unit of its scenarios (their invocations) to finish
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WorkUnit(models.Model):
    """A leased piece of a run: scenarios ``first..last`` of one lane. A worker claims it with a
    conditional UPDATE (owner + lease expiry), renews the lease while it computes, and writes
    cells only while it holds it; the sweeper re-queues units whose lease expired."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="units")
    lane = models.CharField(max_length=16, choices=Lane.choices, default=Lane.RUNS)
    first = models.PositiveIntegerField(help_text="Index of the first scenario.")
    last = models.PositiveIntegerField(help_text="Index of the last scenario.")
    step_keys = models.JSONField(
        default=list,
        help_text="The evaluator steps this unit computes (runs lane: also inputs and invocations).",
    )
    status = models.CharField(max_length=16, choices=UnitStatus.choices, default=UnitStatus.QUEUED)
    owner = models.CharField(max_length=200, blank=True, help_text="host:pid:token of the holder.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="Its last message went out.")
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "lane", "first"]
        constraints = [
            models.UniqueConstraint(fields=["run", "lane", "first"], name="workunit_unique_range")
        ]
        indexes = [
            models.Index(fields=["run", "lane", "status", "first"]),
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="leased"),
                name="workunit_leased_expiry",
            ),
            models.Index(fields=["sent_at"], condition=Q(status="queued"), name="workunit_queued"),
        ]

    def __str__(self) -> str:
        return f"{self.lane} {self.first}..{self.last} of run {self.run_id}"


class ScenarioStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    ERRORS = "errors"
    CANCELLED = "cancelled"


class Scenario(models.Model):
    """One row of a run: a testcase (batch), or a trace (online)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="scenarios")
    index = models.PositiveIntegerField()
    testcase = models.ForeignKey(
        Testcase, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    inputs = models.JSONField(
        default=dict, help_text="The testcase row or the trace's root inputs."
    )
    trace = models.ForeignKey(
        Trace,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Online runs: the trace this scenario evaluates (a session's last trace).",
    )
    session = models.ForeignKey(
        Session,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Session rules: the session this scenario evaluates, as of its trace.",
    )
    status = models.CharField(
        max_length=16, choices=ScenarioStatus.choices, default=ScenarioStatus.PENDING
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="scenario_unique_index"),
            # A trace is evaluated once per run; a session rule's scenarios may share their last
            # trace (a session judged again), their state row keeps them from doubling instead.
            models.UniqueConstraint(
                fields=["run", "trace"],
                condition=Q(trace__isnull=False, session__isnull=True),
                name="scenario_unique_trace",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "status"]),
            models.Index(fields=["run", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"scenario {self.index}"


class ResultStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


FINAL_RESULT_STATUSES = (
    ResultStatus.SUCCESS,
    ResultStatus.ERROR,
    ResultStatus.SKIPPED,
    ResultStatus.CANCELLED,
)


class Result(models.Model):
    """One cell ``(run, scenario, step_key, repeat_idx)``: points at a trace (input and invocation
    steps) or an annotation (annotation steps), or holds an error."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="results")
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="results")
    step_key = models.CharField(max_length=200)
    repeat_idx = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=ResultStatus.choices, default=ResultStatus.PENDING
    )
    trace = models.ForeignKey(
        Trace, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    annotation = models.ForeignKey(
        "Annotation", null=True, blank=True, on_delete=models.SET_NULL, related_name="results"
    )
    testcase = models.ForeignKey(
        Testcase, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error = models.JSONField(null=True, blank=True, help_text="{code, type, message, stacktrace}")
    duration_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "scenario", "step_key", "repeat_idx"], name="result_unique_cell"
            )
        ]
        indexes = [
            models.Index(fields=["run", "step_key", "status"]),
            models.Index(fields=["scenario", "step_key"]),
        ]

    def __str__(self) -> str:
        return f"{self.step_key}[{self.repeat_idx}] of {self.scenario_id}: {self.status}"


# --- annotations ------------------------------------------------------------------------------


class Origin(models.TextChoices):
    AUTO = "auto"
    HUMAN = "human"
    CUSTOM = "custom"
    GOLD = "gold"  # the settled label of an annotation queue item


class Channel(models.TextChoices):
    WEB = "web"
    API = "api"
    SDK = "sdk"


class AnnotationQuerySet(ProjectQuerySet):
    def for_evaluator(self, ref: str | int):
        """Match by evaluator id or slug: annotations carry both, so either finds them."""
        if isinstance(ref, int) or str(ref).isdecimal():
            return self.filter(Q(evaluator_id=int(ref)) | Q(evaluator_slug=str(ref)))
        return self.filter(evaluator_slug=ref)


class Annotation(models.Model):
    """A judgement attached to a trace (span): what an evaluator or a person returned."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="annotations")
    trace = models.ForeignKey(
        Trace,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="annotations",
        help_text="The annotated trace.",
    )
    span_id = models.CharField(max_length=64, blank=True)
    outputs = models.JSONField(default=dict)
    evaluator = models.ForeignKey(
        "evaluators.Evaluator", on_delete=models.PROTECT, related_name="annotations"
    )
    evaluator_slug = models.SlugField(max_length=100)
    revision = models.ForeignKey(
        "evaluators.EvaluatorRevision",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="annotations",
    )
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.AUTO)
    channel = models.CharField(max_length=16, choices=Channel.choices, default=Channel.API)
    judge_trace = models.ForeignKey(
        Trace,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The evaluator's own trace (an LLM judge call), when it has one.",
    )
    details = models.JSONField(default=dict, blank=True, help_text="Logs, reasoning, extras.")
    history = models.JSONField(
        default=list, blank=True, help_text="Earlier values: [{outputs, origin, by, at}]."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = AnnotationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["project", "evaluator_slug"]),
            models.Index(fields=["project", "evaluator"]),
            models.Index(fields=["trace"]),
        ]

    def __str__(self) -> str:
        return f"{self.evaluator_slug} on {self.trace_id}"

    @property
    def references(self) -> dict:
        revision = self.revision
        return {
            "evaluator": {"id": self.evaluator_id, "slug": self.evaluator_slug},
            "revision": revision.reference if revision else None,
        }


# --- metrics ----------------------------------------------------------------------------------


class RunMetrics(models.Model):
    """Statistics of a run: run-wide (no scenario, no bucket), per scenario, or per time bucket.

    ``data`` maps ``step_key`` -> ``metric key`` -> statistics (see docs/metrics.md).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    scenario = models.ForeignKey(
        Scenario, null=True, blank=True, on_delete=models.CASCADE, related_name="metrics"
    )
    bucket_start = models.DateTimeField(null=True, blank=True)
    data = models.JSONField(default=dict)
    refreshed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # One row run-wide (both NULL), one per scenario, one per bucket; NULLs compare
            # equal so upserts (ON CONFLICT) work for all three.
            models.UniqueConstraint(
                fields=["run", "scenario", "bucket_start"],
                nulls_distinct=False,
                name="runmetrics_unique_row",
            ),
        ]

    def __str__(self) -> str:
        return f"metrics of run {self.run_id}"


class ScenarioValue(models.Model):
    """The read model of a run's per-scenario metric values: one row per scenario, annotation
    step and numeric or boolean metric key, and one per scenario and invocation step's
    ``duration``, ``tokens`` and ``costs``, holding the mean over the scenario's repeats of its
    successful cells (a boolean as its rate) and how many of its cells errored.

    Written with the per-scenario statistics (``metrics.scenarios_refresh``), never by a
    request. The scenario table sorts, filters and pages on it through one index, comparisons
    read both runs from it in one indexed scan, and run-wide metrics aggregate it."""

    # The unique constraint leads with run: a second index on run alone would only be written.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="+")
    index = models.PositiveIntegerField(help_text="The scenario's index in its run.")
    step_key = models.CharField(max_length=200)
    key = models.TextField(help_text='The dotted path inside the outputs: "score".')
    value = models.FloatField(null=True, blank=True, help_text="NULL: no successful cell.")
    errors = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_key", "key", "index"], name="scenariovalue_unique_cell"
            ),
        ]
        indexes = [
            # Sorting and keyset paging by a metric: (value, index) in index order.
            models.Index(
                fields=["run", "step_key", "key", "value", "index"], name="scenariovalue_sort"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.step_key}.{self.key} of scenario {self.index}"


class ScenarioValuePack(models.Model):
    """A finished run's read model packed for comparisons: per step and metric key, every
    scenario's index and value as byte strings of big-endian numbers and the indexes errored
    without a value, read by numpy without a row per scenario; one more pack (step and key
    empty) holds the indexes of the run's scenarios with a testcase. Stamped with the refresh it
    was packed from (the run's ``metrics_refreshed_at``): a reader uses a pack whose stamp is the
    run's and otherwise reads ``ScenarioValue``.

    Each pack is stored in the narrowest exact shape (``runs.metrics.packs``): no indexes when
    they are 0 to ``count`` - 1, and values as integers of 1, 2 or 4 bytes scaled by a power of
    ten when every value comes back from that as the same double, else as float8.

    Written by ``metrics.values_pack`` on a worker after a finished run's read model refresh,
    never by a request."""

    class Dtype(models.TextChoices):
        F8 = "f8", "float8"
        I1 = "i1", "int1"
        I2 = "i2", "int2"
        I4 = "i4", "int4"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    step_key = models.CharField(max_length=200, blank=True)
    key = models.TextField(blank=True)
    # Database defaults too: a host still on the code before these fields packs as before.
    count = models.PositiveIntegerField(
        default=0, db_default=0, help_text="How many scenarios it holds (its indexes' length)."
    )
    indexes = models.BinaryField(
        help_text="Scenario indexes, int4 big-endian, ascending; empty when they are 0 to count - 1."
    )
    numbers = models.BinaryField(
        help_text="Their values, big-endian, of dtype: float8 (NaN without one), or integers "
        "(the type's least without one) to divide by 10 ** scale."
    )
    dtype = models.CharField(
        max_length=2, choices=Dtype.choices, default=Dtype.F8, db_default=Dtype.F8
    )
    scale = models.PositiveSmallIntegerField(default=0, db_default=0)
    errored = models.BinaryField(help_text="Indexes errored without a value, int4 big-endian.")
    refreshed_at = models.DateTimeField(help_text="The run's metrics_refreshed_at it is of.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step_key", "key"], name="valuepack_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.step_key}.{self.key} of run {self.run_id} (packed)"


class InferredSchema(models.Model):
    """The outputs schema inferred from every output stored for a revision that has none.

    A cache, not a record: re-inferred when the revision has gained outputs since (run-wide
    refreshes check), reused by per-scenario refreshes so they stay cheap."""

    revision = models.OneToOneField(
        "evaluators.EvaluatorRevision", on_delete=models.CASCADE, related_name="inferred_schema"
    )
    schema = models.JSONField(default=dict)
    fields = models.JSONField(default=list)
    total = models.PositiveIntegerField(
        default=0, help_text="How many outputs it was inferred from."
    )
    inferred_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"inferred schema of {self.revision_id}"


# --- online evaluation ------------------------------------------------------------------------


class RuleTarget(models.TextChoices):
    TRACE = "trace", "Traces"
    SESSION = "session", "Sessions"


class OnlineRule(models.Model):
    """Evaluate new traces matching a filter with an evaluator revision, sampled by trace id;
    or, targeting sessions, each session once it has been idle for ``idle_seconds``."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="online_rules")
    name = models.CharField(max_length=200)
    revision = models.ForeignKey(
        "evaluators.EvaluatorRevision", on_delete=models.PROTECT, related_name="online_rules"
    )
    filter = models.JSONField(
        default=dict, blank=True, help_text="{name, attributes: {path: value}, since, until}"
    )
    sampling_rate = models.FloatField(default=1.0)
    active = models.BooleanField(default=True)
    paused_reason = models.CharField(max_length=500, blank=True)
    run = models.OneToOneField(
        Run,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="online_rule",
        help_text="The live run whose scenarios are the evaluated traces.",
    )
    bucket_seconds = models.PositiveIntegerField(default=3600)
    target = models.CharField(
        max_length=16,
        choices=RuleTarget.choices,
        default=RuleTarget.TRACE,
        help_text="What one evaluation judges: a trace, or a whole session. Fixed for life.",
    )
    idle_seconds = models.PositiveIntegerField(
        default=900, help_text="Session rules: judge a session once nothing arrived this long."
    )
    sessions_swept_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Session rules: sessions whose spans all arrived by then have been decided.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def for_sessions(self) -> bool:
        return self.target == RuleTarget.SESSION


class SessionRuleState(models.Model):
    """What a session rule last judged of a session: claimed with one conditional upsert, so a
    session is judged once per idle period whatever the number of sweeps, hosts or workers."""

    rule = models.ForeignKey(OnlineRule, on_delete=models.CASCADE, related_name="session_states")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    evaluated_activity = models.DateTimeField(help_text="The session's last_activity then.")
    evaluated_traces = models.PositiveIntegerField(help_text="Its trace_count then.")
    scenario = models.ForeignKey(
        Scenario, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    fired_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "session"], name="session_rule_state_unique")
        ]

    def __str__(self) -> str:
        return f"{self.rule_id}/{self.session_id} @ {self.evaluated_activity}"


# --- annotation queues ------------------------------------------------------------------------


class AnnotationQueue(models.Model):
    """Items (traces, usually a run's scenarios) reviewed by people with a human-feedback
    evaluator's form, each by ``reviewers_per_item`` reviewers; disagreements go to an
    adjudicator, and every settled item gets a gold label."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="annotation_queues")
    slug = models.SlugField(max_length=100)
    name = models.CharField(max_length=200)
    instructions = models.TextField(blank=True, help_text="Markdown, shown beside the form.")
    evaluator = models.ForeignKey(
        "evaluators.Evaluator", on_delete=models.PROTECT, related_name="annotation_queues"
    )
    revision = models.ForeignKey(
        "evaluators.EvaluatorRevision",
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The form's revision: the evaluator's head when the queue was made.",
    )
    reviewers_per_item = models.PositiveSmallIntegerField(default=2)
    blind = models.BooleanField(
        default=True,
        help_text="Reviewers see neither the other reviews nor the automatic verdicts "
        "until they submit.",
    )
    min_agreement = models.FloatField(
        default=1.0,
        help_text="Items whose reviewers agree less than this (share of agreeing pairs, "
        "0..1) go to an adjudicator; 1.0 sends every disagreement.",
    )
    reservation_seconds = models.PositiveIntegerField(default=900)
    reviewers = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="review_queues"
    )
    adjudicators = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="adjudication_queues"
    )
    trace_filter = models.JSONField(
        null=True,
        blank=True,
        help_text="Online feed: new traces matching this filter (as an online rule's) join.",
    )
    sampling_rate = models.FloatField(default=1.0, help_text="Online feed: share of matches.")
    agreement = models.JSONField(default=dict, blank=True, help_text="The last computed report.")
    agreement_refreshed_at = models.DateTimeField(null=True, blank=True)
    archived = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "slug"], name="queue_unique_slug"),
            models.CheckConstraint(
                condition=Q(reviewers_per_item__gte=1, reviewers_per_item__lte=5),
                name="queue_reviewers_1_to_5",
            ),
            models.CheckConstraint(
                condition=Q(min_agreement__gte=0, min_agreement__lte=1),
                name="queue_min_agreement_0_to_1",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ItemStatus(models.TextChoices):
    OPEN = "open", "Collecting reviews"
    ADJUDICATION = "adjudication", "Waiting for an adjudicator"
    GOLD = "gold", "Settled"


class ItemSource(models.TextChoices):
    RUN = "run", "A run's scenarios"
    RULE = "rule", "Online traces"
    MANUAL = "manual", "Added by hand"
    API = "api", "Added through the API"


class SettledBy(models.TextChoices):
    UNANIMOUS = "unanimous"
    MAJORITY = "majority"
    ADJUDICATOR = "adjudicator"


class QueueItem(models.Model):
    """One trace to review (a run's scenario when it came from a run)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    queue = models.ForeignKey(AnnotationQueue, on_delete=models.CASCADE, related_name="items")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="queue_items")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    scenario = models.ForeignKey(
        Scenario, null=True, blank=True, on_delete=models.SET_NULL, related_name="queue_items"
    )
    source = models.CharField(max_length=16, choices=ItemSource.choices)
    position = models.PositiveIntegerField(help_text="Reviewers get items in this order.")
    status = models.CharField(max_length=16, choices=ItemStatus.choices, default=ItemStatus.OPEN)
    agreement = models.FloatField(
        null=True, blank=True, help_text="Share of reviewer pairs that agree, over the fields."
    )
    gold = models.ForeignKey(
        Annotation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    settled_by = models.CharField(max_length=16, choices=SettledBy.choices, blank=True)
    adjudicated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["queue", "position"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "trace"], name="queue_item_unique_trace"),
            models.UniqueConstraint(
                fields=["queue", "position"], name="queue_item_unique_position"
            ),
        ]
        indexes = [models.Index(fields=["queue", "status", "position"])]

    def __str__(self) -> str:
        return f"item {self.position} of {self.queue_id}"


class ReviewStatus(models.TextChoices):
    RESERVED = "reserved"
    SUBMITTED = "submitted"
    SKIPPED = "skipped"


class Review(models.Model):
    """One reviewer's answer to one item; a reservation until it is submitted or skipped."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    queue = models.ForeignKey(AnnotationQueue, on_delete=models.CASCADE, related_name="reviews")
    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reviews"
    )
    status = models.CharField(
        max_length=16, choices=ReviewStatus.choices, default=ReviewStatus.RESERVED
    )
    outputs = models.JSONField(null=True, blank=True)
    reserved_until = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["item", "submitted_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["item", "reviewer"], name="review_unique_reviewer")
        ]
        indexes = [models.Index(fields=["queue", "reviewer", "status"])]

    def __str__(self) -> str:
        return f"{self.reviewer_id} on {self.item_id}: {self.status}"


class AlignmentStatus(models.TextChoices):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    ACCEPTED = "accepted"
    DISCARDED = "discarded"


class JudgeAlignment(models.Model):
    """A candidate revision of an LLM judge whose prompt carries few-shot examples taken from
    gold labels it got wrong, measured against the base revision on held-out gold items."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    base = models.ForeignKey(
        "evaluators.EvaluatorRevision", on_delete=models.CASCADE, related_name="+"
    )
    candidate = models.ForeignKey(
        "evaluators.EvaluatorRevision",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    queue = models.ForeignKey(AnnotationQueue, on_delete=models.CASCADE, related_name="alignments")
    gold_field = models.CharField(max_length=64)
    output_field = models.CharField(max_length=64)
    shots = models.PositiveSmallIntegerField(default=4)
    seed = models.PositiveIntegerField(default=0)
    train = models.JSONField(default=list, help_text="Queue item ids the examples came from.")
    heldout = models.JSONField(default=list, help_text="Queue item ids both revisions judge.")
    examples = models.JSONField(default=list, help_text="The few-shot cases in the prompt.")
    estimate = models.JSONField(default=dict, help_text="{calls, tokens, cost_usd} before running.")
    max_cost_usd = models.FloatField(null=True, blank=True)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    records = models.JSONField(default=dict, help_text="{base, candidate}: held-out records.")
    status = models.CharField(
        max_length=16, choices=AlignmentStatus.choices, default=AlignmentStatus.RUNNING
    )
    error = models.JSONField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"alignment of {self.base_id}"
