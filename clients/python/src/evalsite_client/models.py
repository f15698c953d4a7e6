"""Typed views of the API's answers. Unknown fields are ignored (a newer server may add some);
tests/client/test_models_schema.py checks every field here against the server's OpenAPI schema
(and the free-form parts against live answers), so a renamed field fails evalsite's CI."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ACTIVE_STATUSES = ("pending", "queued", "running")
FINISHED_STATUSES = ("success", "errors")  # ended and usable as a baseline


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Project(Model):
    id: int
    slug: str
    name: str
    role: str


class TestsetVersion(Model):
    __test__ = False  # not a pytest class
    id: int
    version: int
    slug: str
    columns: list[str]
    row_count: int = 0


class Testset(Model):
    __test__ = False
    id: int
    slug: str
    name: str
    version: int | None = None
    row_count: int = 0
    head: TestsetVersion | None = None


class Application(Model):
    id: int
    slug: str
    name: str
    kind: str


class RunStep(Model):
    key: str
    type: str
    references: dict[str, Any] = Field(default_factory=dict)

    @property
    def evaluator_slug(self) -> str | None:
        evaluator = self.references.get("evaluator") or {}
        return evaluator.get("slug")


class RunTestset(Model):
    id: int
    slug: str
    version: int


class RunApplication(Model):
    id: int
    slug: str
    kind: str


class Run(Model):
    id: int
    name: str
    description: str = ""
    status: str = "pending"
    closed: bool = False
    testset: RunTestset | None = None
    application: RunApplication | None = None
    repeats: int = 1
    steps: list[RunStep] = Field(default_factory=list)
    mappings: list[dict[str, Any]] = Field(default_factory=list)
    scenario_count: int = 0
    total_cells: int = 0
    done_cells: int = 0
    error_cells: int = 0
    progress: float = 0.0  # percent of the cells done
    error: dict[str, Any] | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    max_cost_usd: float | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    def step(self, key: str) -> RunStep | None:
        return next((s for s in self.steps if s.key == key), None)

    def steps_of(self, type: str) -> list[RunStep]:
        return [s for s in self.steps if s.type == type]


class Tokens(Model):
    prompt: int | None = None
    completion: int | None = None
    total: int | None = None


class EstimateStep(Model):
    key: str
    type: str
    cells: int
    calls: int = 0
    tokens: Tokens | None = None
    cost_usd: float | None = None
    notes: list[str] = Field(default_factory=list)
    judge: dict[str, Any] | None = None  # LLM judges: connection, model, price, tokens per call


class Caps(Model):
    run: float | None = None
    project: float | None = None
    judges: dict[str, float] = Field(default_factory=dict)  # a judge's own cap, by step


class Estimate(Model):
    """What a run will cost before it starts (``POST /runs`` with ``dry_run``)."""

    scenarios: int
    repeats: int
    cells: int = 0
    steps: list[EstimateStep] = Field(default_factory=list)
    application_calls: int = 0
    judge_calls: int = 0
    tokens: Tokens | None = None
    cost_usd: float | None = None
    caps: Caps = Field(default_factory=Caps)
    cap_usd: float | None = None  # the binding cap: the lower of the run's and the project's
    over_cap: bool = False
    sample_rows: int = 0
    sample_indexes: list[int] = Field(default_factory=list)  # the rows whose prompts were rendered
    notes: list[str] = Field(default_factory=list)


class ComparisonRunTestset(Model):
    id: int
    slug: str
    version: int


class ComparisonRun(Model):
    id: int
    name: str
    status: str
    testset: ComparisonRunTestset
    baseline: bool


class MetricSummary(Model):
    """One run's value of a metric: mean (or rate), how many scenarios had one, errors."""

    run: int
    value: float | None = None
    count: int
    errors: int


class Excluded(Model):
    errors: int = 0
    missing: int = 0


class PairedTest(Model):
    """A candidate against the baseline over the scenarios both valued (docs/compare.md)."""

    run: int
    test: str
    method: str = ""
    n: int
    difference: float | None = None
    ci: list[float] | None = None
    p_value: float | None = None
    verdict: str  # better | worse | inconclusive
    excluded: Excluded = Field(default_factory=Excluded)


class MetricComparison(Model):
    metric: str  # evaluator slug + metric key: "exact.success"
    evaluator: str
    key: str
    type: str  # binary | continuous | discrete
    higher_is_better: bool
    runs: list[MetricSummary]
    tests: list[PairedTest]

    def summary(self, run_id: int) -> MetricSummary | None:
        return next((s for s in self.runs if s.run == run_id), None)

    def test_of(self, run_id: int) -> PairedTest | None:
        return next((t for t in self.tests if t.run == run_id), None)


class ComparedCell(Model):
    run: int
    present: bool
    status: str | None = None
    outputs: Any = None
    values: dict[str, Any] = Field(default_factory=dict)
    errors: dict[str, Any] = Field(default_factory=dict)
    deltas: dict[str, float] = Field(default_factory=dict)


class ComparedRow(Model):
    index: int
    inputs: dict[str, Any] = Field(default_factory=dict)
    runs: list[ComparedCell]

    def cell(self, run_id: int) -> ComparedCell | None:
        return next((c for c in self.runs if c.run == run_id), None)


class Comparison(Model):
    """``GET /runs/compare``: per shared metric each run's summary and each candidate's paired
    test, and one page of aligned rows (``rows``, ``count`` of them in all)."""

    runs: list[ComparisonRun]
    baseline: int
    alignment: str = ""
    metrics: list[MetricComparison]
    count: int
    offset: int = 0
    rows: list[ComparedRow] = Field(default_factory=list)


class HistoryCase(Model):
    index: int
    inputs: str = ""  # a short preview
    evaluator: str
    klass: str = Field(alias="class")  # regressed | flaky | fixed | stable_fail | stable_pass ...
    flips: int = 0
    flip_rate: float | None = None
    verdicts: list[str] = Field(default_factory=list)  # pass | fail | error | missing | mixed


class HistoryRun(Model):
    id: int
    name: str
    version: int
    tags: dict[str, str] = Field(default_factory=dict)
    baseline: bool = False
    candidate: bool = False


class History(Model):
    """``GET /testsets/{ref}/history``: each test case's verdicts across a testset's runs
    (oldest first, ending at the candidate) and its class."""

    runs: list[HistoryRun] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)  # per class, before the class filter
    count: int = 0
    cases: list[HistoryCase] = Field(default_factory=list)


class ScenarioRow(Model):
    index: int
    status: str
    values: dict[str, Any] = Field(default_factory=dict)
    errors: dict[str, Any] = Field(default_factory=dict)


class ScenarioTable(Model):
    """``GET /runs/{id}/scenarios``: a page of the scenario table."""

    count: int
    columns: list[dict[str, Any]]
    rows: list[ScenarioRow]
