"""A run's shape: its steps (keys, the annotation step of an evaluator revision, the lane that
computes each) and its scenarios from a testset version."""

from __future__ import annotations

from evaluators.kinds import REGISTRY
from evaluators.models import EvaluatorRevision
from runs import conf
from runs.models import (
    Application,
    Lane,
    Run,
    RunStep,
    Scenario,
    StepType,
    Testcase,
    Testset,
    TestsetVersion,
)

PEOPLE_KINDS = ("human", "feedback")  # kinds whose cells people (or the user's code) fill in


def step_key_for_testset(testset: Testset) -> str:
    return f"testset-{testset.slug}"


def step_key_for_application(application: Application) -> str:
    return f"application-{application.slug}"


def step_key_for_revision(revision: EvaluatorRevision) -> str:
    return f"evaluator-{revision.slug}"


def invocation_step(run: Run, application: Application) -> RunStep:
    return RunStep(
        run=run,
        key=step_key_for_application(application),
        type=StepType.INVOCATION,
        position=1,
        references={
            "application": {"id": application.pk, "slug": application.slug, "version": None}
        },
    )


def annotation_step(run: Run, revision: EvaluatorRevision, position: int) -> RunStep:
    return RunStep(
        run=run,
        key=step_key_for_revision(revision),
        type=StepType.ANNOTATION,
        position=position,
        revision=revision,
        references={
            "evaluator": {"id": revision.evaluator_id, "slug": revision.evaluator.slug},
            "revision": revision.reference,
        },
    )


def step_lane(step: RunStep) -> str:
    """Model calls wait on the network: the ``llm`` lane, whose workers run many at once. Code
    goes to the ``code`` lane when the ``celery`` code runner keeps user code on its own hosts.
    Everything else is cheap enough to run beside the application calls."""
    revision = step.revision
    if revision is None:
        return Lane.RUNS
    kind = REGISTRY.get(revision.kind)
    if kind is not None and kind.needs_model:
        return Lane.LLM
    if (revision.parameters or {}).get("connection"):  # agent scores with a model connection
        return Lane.LLM
    if revision.kind == "code" and conf.code_runner() == "celery":
        return Lane.CODE
    return Lane.RUNS


def steps_by_lane(steps: list[RunStep]) -> dict[str, list[str]]:
    """Annotation step keys per lane; the runs lane is always there (inputs and invocations)."""
    lanes: dict[str, list[str]] = {Lane.RUNS: []}
    for step in steps:
        if step.type == StepType.ANNOTATION:
            lanes.setdefault(step_lane(step), []).append(step.key)
    return lanes


def scenarios_from_testcases(run: Run, version: TestsetVersion) -> None:
    rows = (
        Testcase.objects.filter(version=version)
        .values_list("pk", "index", "data")
        .order_by("index")
    )
    batch: list[Scenario] = []
    count = 0
    for pk, index, data in rows.iterator(chunk_size=2000):
        batch.append(
            Scenario(project_id=run.project_id, run=run, index=index, testcase_id=pk, inputs=data)
        )
        count += 1
        if len(batch) >= 2000:
            Scenario.objects.bulk_create(batch)
            batch = []
    Scenario.objects.bulk_create(batch)
    run.scenario_count = count
