"""Replaying production: a filtered set of production traces (or sessions) becomes a testset, and
two runs over it with the same evaluators, the production outputs as they were and a new
application version, are queued so the comparison pairs them row by row (docs/replay.md).

A row holds the root span's inputs (a dict's keys as columns, anything else as ``input``), the
production output (``production_output``), or, when the root failed, its error
(``production_error``: the production side records that error, never a score), where it came
from (``source_trace_id``, ``source_session_id``) and, when people gave one, the ground truth
(``correct_answer``): the newest correction or gold label on that trace carrying one of
``TRUTH_KEYS``. A session's row is
its first production trace's: the first user turn, and what production answered to it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Project
from evaluators.models import EvaluatorRevision
from runs import engine, testsets
from runs.applications import application_create
from runs.models import (
    Annotation,
    Application,
    Origin,
    Run,
    Session,
    Span,
    Testset,
    TestsetVersion,
    Trace,
)
from runs.online.rules import ONLINE_SOURCES
from runs.traces import trace_list
from runs.traces.sessions import session_list

REPLAY_SOURCES = ("traces", "sessions")
REPLAY_DEFAULT_LIMIT = 1_000
REPLAY_MAX_LIMIT = 10_000
SAMPLE_ROWS = 10
# Traces whose roots and annotations are read per query: a root may hold up to a MiB, so a
# chunk bounds what one query brings in, and a replay too big for a testset stops early.
CHUNK = 200
SLUG_ATTEMPTS = 3

PRODUCTION_COLUMN = "production_output"
PRODUCTION_ERROR_COLUMN = "production_error"  # only in the rows of failed traces
FAILED_WITHOUT_MESSAGE = "The production trace failed (its root span's status is error)."
TRUTH_COLUMN = "correct_answer"
INPUT_COLUMN = "input"  # the inputs when the root's inputs are not an object
BLANK_INPUT = "input_blank"  # an input key that is empty or only spaces, which no column may be
SOURCE_COLUMNS = ("source_trace_id", "source_session_id")
# An annotation's outputs key that holds the right answer, in the order they are looked for.
TRUTH_KEYS = (
    "correct_answer",
    "expected_output",
    "expected",
    "ground_truth",
    "reference",
    "correction",
    "corrected_output",
)
# People's judgements: a correction (human), one sent through the API or an SDK (custom), or
# the settled label of an annotation queue (gold). Evaluators' own outputs (auto) never count.
TRUTH_ORIGINS = (Origin.HUMAN, Origin.CUSTOM, Origin.GOLD)

PRODUCTION_APP_SLUG = "production-replayed"
PRODUCTION_CONFIG = {"outputs_column": PRODUCTION_COLUMN, "error_column": PRODUCTION_ERROR_COLUMN}
PRODUCTION_APP_NAME = "Production (replayed)"
SESSION_FILTERS = ("search", "status", "since", "until", "min_turns")
ROW_NUMBER = re.compile(r"^row (\d+)")  # how testsets name a row in their refusals


class ReplayFilters(BaseModel):
    """Which production traces (or sessions) to replay: the traces list's filters, or the
    sessions list's (``search`` in the session id, ``status``, ``since`` and ``until`` on the
    last activity, ``min_turns``)."""

    model_config = ConfigDict(extra="forbid")

    search: str = Field("", max_length=300, description="Traces: in the name, or a trace id.")
    status: Literal["", "ok", "error"] = ""
    since: datetime | None = Field(
        None, description="Traces: started at or after this. Sessions: last active at or after."
    )
    until: datetime | None = Field(
        None, description="Traces: started before this. Sessions: last active before this."
    )
    min_turns: int | None = Field(
        None, ge=1, le=1_000_000, description="Sessions: at least this many traces."
    )
    name: str = Field("", max_length=300, description="Traces: the root span's name, exactly.")
    source: Literal["", "api", "otlp"] = Field("", description="Traces: how they were sent.")
    attributes: dict[str, str | bool | int | float] = Field(
        default_factory=dict, description="Traces: dotted path -> value that any span has."
    )

    def attribute_values(self) -> dict[str, str]:
        """As ``trace_list`` takes them: text, where "2" and "true" also match the JSON value."""
        return {
            path: value if isinstance(value, str) else json.dumps(value)
            for path, value in self.attributes.items()
        }

    def aware(self, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value and value.tzinfo is None else value


@dataclass
class Preview:
    """What a replay would take, before anything is created."""

    source: str
    matched: int  # items that match, counted up to REPLAY_MAX_LIMIT + 1
    limit: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # the first few rows

    @property
    def count(self) -> int:
        """The rows the testset would get: the newest ``limit`` of the matches."""
        return min(self.matched, self.limit)

    @property
    def more(self) -> bool:
        return self.matched > self.limit

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(key for row in self.rows for key in row))


@dataclass
class Replay:
    """A replay made: its testset version and its two runs, tagged ``replay:<id>`` and
    ``side:production`` / ``side:candidate``."""

    id: str
    source: str
    testset: Testset
    version: TestsetVersion
    production: Run
    candidate: Run

    @property
    def compare_query(self) -> str:
        """The comparison's query string: production is the baseline."""
        return f"runs={self.production.pk},{self.candidate.pk}&baseline={self.production.pk}"


# --- filters and selection --------------------------------------------------------------------


def replay_filters_parse(source: str, raw: Any) -> ReplayFilters:
    if source not in REPLAY_SOURCES:
        raise InvalidInput({"source": [f"{source!r}: replay traces or sessions."]})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput({"filters": ["must be a JSON object: {search, status, since, until}"]})
    try:
        found = ReplayFilters.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc, prefix="filters"))
    if source == "sessions":
        extra = [k for k, v in raw.items() if k not in SESSION_FILTERS and v not in ("", {}, None)]
        if extra:
            raise InvalidInput(
                {
                    f"filters.{extra[0]}": [
                        "sessions are filtered by search, status, since, until, min_turns"
                    ]
                }
            )
    elif found.min_turns is not None:
        raise InvalidInput({"filters.min_turns": ["only sessions are filtered by their turns"]})
    return found


def replay_limit_check(limit: Any) -> int:
    if limit is None or limit == "":
        return REPLAY_DEFAULT_LIMIT
    if (
        isinstance(limit, bool)
        or not str(limit).isdecimal()
        or not 1 <= int(limit) <= REPLAY_MAX_LIMIT
    ):
        raise InvalidInput({"limit": [f"a whole number from 1 to {REPLAY_MAX_LIMIT:,}"]})
    return int(limit)


def _with_root(traces: QuerySet[Trace]) -> QuerySet[Trace]:
    """Traces whose root span arrived: a trace without one has no inputs to replay. The root is
    looked for in its trace's arrival time, the span table's partition key."""
    roots = Span.objects.filter(
        trace_id=OuterRef("pk"), trace_time=OuterRef("created_at"), parent_id=""
    )
    return traces.filter(Exists(roots))


def traces_selected(*, project: Project, filters: ReplayFilters) -> QuerySet[Trace]:
    """Production traces matching the filters, newest first. Traces that runs recorded (their
    invocations, their judges' calls) are never replayed."""
    traces = trace_list(
        project=project,
        name=filters.name,
        search=filters.search,
        status=filters.status,
        source=filters.source,
        since=filters.aware(filters.since),
        until=filters.aware(filters.until),
        attributes=filters.attribute_values(),
    ).filter(source__in=ONLINE_SOURCES)
    return _with_root(traces).order_by("-id")


def sessions_selected(*, project: Project, filters: ReplayFilters) -> QuerySet[Session]:
    """Sessions matching the sessions list's filters (``since`` / ``until`` on their last
    activity, ``min_turns`` traces at least) that hold a production trace, most recently active
    first."""
    sessions = session_list(
        project=project,
        search=filters.search,
        status=filters.status,
        since=filters.aware(filters.since),
        until=filters.aware(filters.until),
        min_traces=filters.min_turns,
    )
    turns = _with_root(
        Trace.objects.filter(
            project_id=OuterRef("project_id"),
            session_id=OuterRef("session_id"),
            source__in=ONLINE_SOURCES,
        )
    )
    return sessions.filter(Exists(turns))


def _selected(project: Project, source: str, filters: ReplayFilters) -> QuerySet:
    if source == "sessions":
        return sessions_selected(project=project, filters=filters)
    return traces_selected(project=project, filters=filters)


# --- rows -------------------------------------------------------------------------------------


def replay_rows(
    *,
    project: Project,
    source: str,
    items: Iterable[Trace] | Iterable[Session],
    max_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """The testset rows of these traces (or sessions), in their order. With ``max_bytes``, the
    rows (as JSON) must fit in that many bytes: reading stops at the chunk that goes over, and
    the refusal says how many rows fit."""
    items = list(items)
    if source == "sessions":
        firsts = _first_turns(project, [s.session_id for s in items])
        pairs = [(firsts[s.session_id], s.session_id) for s in items if s.session_id in firsts]
    else:
        pairs = [(trace, None) for trace in items]
    rows: list[dict[str, Any]] = []
    size = 0
    for start in range(0, len(pairs), CHUNK):
        chunk = pairs[start : start + CHUNK]
        traces = [trace for trace, _ in chunk]
        roots, truths = _roots(traces), _truths(project, [t.pk for t in traces])
        for trace, session_id in chunk:
            row = _row(trace, session_id, roots.get(trace.pk), truths)
            if max_bytes is not None:
                size += len(json.dumps(row, ensure_ascii=False, default=str).encode())
                if size > max_bytes:
                    raise _too_big(source, len(pairs), len(rows), max_bytes)
            rows.append(row)
    return rows


def _too_big(source: str, count: int, fit: int, max_bytes: int) -> InvalidInput:
    mb = f"{max_bytes / 1_048_576:.1f} MB" if max_bytes >= 1_048_576 else f"{max_bytes:,} bytes"
    if not fit:
        reason = f"the newest production {source.removesuffix('s')} alone is larger than {mb}"
    else:
        reason = f"only the newest {fit:,} fit in {mb}; set at most {fit:,} or narrow the filters"
    return InvalidInput(
        {"limit": [f"The {count:,} rows are more than a testset may hold: {reason}."]}
    )


def _first_turns(project: Project, session_ids: list[str]) -> dict[str, Trace]:
    """Each session's first production trace with a root: where its conversation starts."""
    firsts: dict[str, Trace] = {}
    for start in range(0, len(session_ids), CHUNK):
        traces = _with_root(
            Trace.objects.filter(
                project=project,
                session_id__in=session_ids[start : start + CHUNK],
                source__in=ONLINE_SOURCES,
            )
        )
        first = traces.order_by("session_id", "start_time", "id").distinct("session_id")
        firsts |= {trace.session_id: trace for trace in first}
    return firsts


def _roots(traces: list[Trace]) -> dict[int, tuple[Any, Any, str, str]]:
    """(inputs, outputs, status, status message) of each trace's root span, read without the
    rest of its attributes and without its other spans. The spans are looked for within their traces' arrival times,
    the span table's partition key."""
    if not traces:
        return {}
    arrived = [t.created_at for t in traces]
    spans = Span.objects.filter(
        trace_id__in=[t.pk for t in traces],
        parent_id="",
        trace_time__gte=min(arrived),
        trace_time__lte=max(arrived),
    ).order_by("trace_id", "start_time", "id")
    root_of = {t.pk: t.root_span_id for t in traces}
    found: dict[int, tuple[Any, Any, str, str]] = {}
    for trace_id, span_id, *root in spans.values_list(
        "trace_id",
        "span_id",
        "attributes__ag__data__inputs",
        "attributes__ag__data__outputs",
        "status",
        "status_message",
    ):
        if trace_id not in found or span_id == root_of[trace_id]:
            found[trace_id] = tuple(root)
    return found


def _truths(project: Project, trace_pks: list[int]) -> dict[int, Any]:
    """The ground truth of each trace that has one: from its newest correction or gold label
    that carries a ``TRUTH_KEYS`` value."""
    annotations = (
        Annotation.objects.filter(
            project=project,
            trace_id__in=trace_pks,
            origin__in=TRUTH_ORIGINS,
            outputs__has_any_keys=list(TRUTH_KEYS),
        )
        .order_by("trace_id", "-updated_at", "-id")
        .values_list("trace_id", "outputs")
    )
    truths: dict[int, Any] = {}
    for trace_pk, outputs in annotations:
        if trace_pk in truths or not isinstance(outputs, dict):
            continue
        value = next((outputs[k] for k in TRUTH_KEYS if outputs.get(k) is not None), None)
        if value is not None:
            truths[trace_pk] = value
    return truths


def _row(trace: Trace, session_id: str | None, root, truths: dict[int, Any]) -> dict[str, Any]:
    inputs, outputs, status, message = root or (None, None, "ok", "")
    truth = truths.get(trace.pk)
    failed = status == "error"
    reserved = {
        PRODUCTION_COLUMN,
        *SOURCE_COLUMNS,
        *([TRUTH_COLUMN] if truth is not None else []),
        *([PRODUCTION_ERROR_COLUMN] if failed else []),
    }
    row = _input_columns(inputs, reserved) if isinstance(inputs, dict) else {INPUT_COLUMN: inputs}
    if truth is not None:
        row[TRUTH_COLUMN] = truth
    row[PRODUCTION_COLUMN] = outputs
    if failed:
        row[PRODUCTION_ERROR_COLUMN] = message or FAILED_WITHOUT_MESSAGE
    row["source_trace_id"] = trace.trace_id
    if session_id is not None:
        row["source_session_id"] = session_id
    return row


def _input_columns(inputs: dict[str, Any], reserved: set[str]) -> dict[str, Any]:
    """The inputs as columns. One named like a column the replay adds keeps its value under
    ``input_<name>``; an empty or blank key, which no column may have, becomes ``input_blank``
    (``input_blank_2``, ... for more)."""
    row: dict[str, Any] = {}
    blanks = 0
    for key, value in inputs.items():
        if not key.strip():
            blanks += 1
            key = BLANK_INPUT if blanks == 1 else f"{BLANK_INPUT}_{blanks}"
            while key in inputs or key in row:
                key = f"{key}_"
        elif key in reserved:
            key = f"input_{key}"
        row[key] = value
    return row


# --- preview and create -----------------------------------------------------------------------


def replay_preview(
    *,
    project: Project,
    source: str = "traces",
    filters: dict | ReplayFilters | None = None,
    limit: Any = REPLAY_DEFAULT_LIMIT,
    sample: int = SAMPLE_ROWS,
) -> Preview:
    """How many traces (or sessions) match and the first rows they would make. Creates
    nothing; counts at most ``REPLAY_MAX_LIMIT + 1`` matches."""
    if not isinstance(filters, ReplayFilters):
        filters = replay_filters_parse(source, filters)
    limit = replay_limit_check(limit)
    selected = _selected(project, source, filters)
    matched = selected[: REPLAY_MAX_LIMIT + 1].count()
    rows = replay_rows(project=project, source=source, items=selected[: min(sample, limit)])
    return Preview(source=source, matched=matched, limit=limit, rows=rows)


def replay_create(
    *,
    project: Project,
    user=None,
    source: str = "traces",
    filters: dict | ReplayFilters | None = None,
    limit: Any = REPLAY_DEFAULT_LIMIT,
    name: str = "",
    testset: Testset | None = None,
    application: Application | None = None,
    evaluators: list[EvaluatorRevision] = (),
) -> Replay:
    """Make the testset (a new one named ``name``, or a new version of ``testset``) from the
    newest ``limit`` matching traces or sessions, and queue two runs over it with the same
    evaluators: production's outputs (the ``production_output`` column) as the baseline, and
    ``application`` as the candidate. All or nothing, in one transaction; the runs' work is
    queued when it commits."""
    if not isinstance(filters, ReplayFilters):
        filters = replay_filters_parse(source, filters)
    limit = replay_limit_check(limit)
    evaluators = list(evaluators)
    _check_choices(project, testset, application, evaluators)
    items = list(_selected(project, source, filters)[:limit])
    if not items:
        raise InvalidInput({"filters": [f"No production {source} match these filters."]})
    rows = replay_rows(project=project, source=source, items=items, max_bytes=testsets.max_bytes())
    replay_id = uuid.uuid4().hex[:12]
    with transaction.atomic():
        version = _testset_version(project, user, source, rows, name, testset)
        production = engine.run_submit(
            project=project,
            name=f"{PRODUCTION_APP_NAME} · {version.testset.name[:170]}",
            testset_version=version,
            application=production_application(project),
            revisions=evaluators,
            author=user,
            description=f"Production outputs of {len(rows)} replayed {source}.",
            tags={"replay": replay_id, "side": "production"},
        )
        candidate = engine.run_submit(
            project=project,
            name=f"{application.name[:97]} · {version.testset.name[:100]}",
            testset_version=version,
            application=application,
            revisions=evaluators,
            author=user,
            description=f"{application.name} over {len(rows)} replayed {source}.",
            tags={"replay": replay_id, "side": "candidate"},
        )
    return Replay(replay_id, source, version.testset, version, production, candidate)


def _check_choices(project, testset, application, evaluators) -> None:
    fields: dict[str, list[str]] = {}
    if testset is not None and testset.project_id != project.pk:
        fields["testset"] = ["No such testset in this project."]
    if application is None or application.project_id != project.pk:
        fields["application"] = ["Choose the application to replay the inputs through."]
    elif application.kind == Application.Kind.LOGGED:
        fields["application"] = ["A logged application cannot be called; choose an HTTP one."]
    if not evaluators:
        fields["evaluators"] = ["Choose at least one evaluator to compare the outputs with."]
    elif any(r.project_id != project.pk for r in evaluators):
        fields["evaluators"] = ["Every evaluator must belong to this project."]
    if fields:
        raise InvalidInput(fields)


def _testset_version(project, user, source, rows, name, testset) -> TestsetVersion:
    message = f"Replayed {len(rows)} production {source}"
    if testset is not None:
        try:
            return testsets.testset_revise(testset=testset, rows=rows, message=message, author=user)
        except InvalidInput as exc:
            raise _row_problems(exc, rows)
    stamp = timezone.localtime().strftime("%Y-%m-%d %H:%M")
    name = name.strip() or f"Production replay {stamp}"
    for _ in range(SLUG_ATTEMPTS):
        try:
            # Its own savepoint: when another replay of the same name took the slug first,
            # this insert fails and the next attempt sees that testset and picks another slug.
            return testsets.testset_create(
                project=project, name=name, rows=rows, message=message, author=user
            ).head
        except IntegrityError:
            continue
        except InvalidInput as exc:
            raise _row_problems(exc, rows)
    raise InvalidInput({"name": ["Other testsets of this name are being made; try again."]})


def _row_problems(exc: InvalidInput, rows: list[dict[str, Any]]) -> InvalidInput:
    """A testset's refusal of the replayed rows, said of the request: a row's problem names the
    trace it came from (under ``filters``, which chose it), anything else is the ``limit``'s."""
    fields: dict[str, list[str]] = {}
    for name, reasons in exc.fields.items():
        for reason in reasons:
            number = ROW_NUMBER.match(reason) if name == "rows" else None
            if number and 1 <= int(number[1]) <= len(rows):
                trace_id = rows[int(number[1]) - 1].get("source_trace_id")
                fields.setdefault("filters", []).append(f"trace {trace_id!r} ({reason})")
            elif name == "rows":
                fields.setdefault("limit", []).append(reason)
            else:
                fields.setdefault(name, []).append(reason)
    return InvalidInput(fields, status=exc.status)


def production_application(project: Project) -> Application:
    """The project's column application reading ``production_output`` (and, for a failed
    trace, its ``production_error``): made once, shared by every replay. Two replays making it
    at once both end up with the one that was stored."""
    found = _production_application(project)
    if found is not None:
        return found
    slug, n = PRODUCTION_APP_SLUG, 2
    while Application.objects.filter(project=project, slug=slug).exists():
        slug, n = f"{PRODUCTION_APP_SLUG}-{n}", n + 1
    try:
        with transaction.atomic():
            return application_create(
                project=project,
                name=PRODUCTION_APP_NAME,
                slug=slug,
                kind=Application.Kind.COLUMN,
                config=PRODUCTION_CONFIG,
                description="The outputs production gave, replayed from traces.",
            )
    except IntegrityError:
        return _production_application(project)


def _production_application(project: Project) -> Application | None:
    apps = Application.objects.for_project(project).filter(
        kind=Application.Kind.COLUMN, config__outputs_column=PRODUCTION_COLUMN
    )
    current = apps.filter(config__error_column=PRODUCTION_ERROR_COLUMN)
    found = current.filter(slug=PRODUCTION_APP_SLUG).first() or current.order_by("pk").first()
    if found is not None:
        return found
    # One made before failed traces carried their error: it learns to read it (the same
    # update from two replays at once gives the same config).
    made = apps.filter(slug=PRODUCTION_APP_SLUG).exclude(config__has_key="error_column").first()
    if made is not None:
        made.config = {**made.config, **PRODUCTION_CONFIG}
        Application.objects.filter(pk=made.pk).update(config=made.config)
    return made


def replay_runs(*, project: Project, replay_id: str) -> dict[str, Run]:
    """A replay's runs by side (``production``, ``candidate``), found by their tags."""
    runs = (
        Run.objects.for_project(project)
        .filter(tags__contains={"replay": replay_id})
        .select_related("testset_version__testset", "application")
    )
    return {run.tags.get("side", ""): run for run in runs.order_by("pk")}
