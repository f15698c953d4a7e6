"""The demo project's testset has a history worth reading: runs on branch main whose cases are
stable, flaky, regressed and fixed; an older demo's testset gets the later answers as a new
version; loading again adds nothing."""

from __future__ import annotations

from evalsite.demo import CAPITALS, demo_load
from evalsite.services import project_create
from runs import history, testsets
from runs.models import Run, Testset


def classes(testset) -> dict[str, str]:
    found = history.testcase_history(
        testset=testset, tags={"branch": "main"}, evaluators=["exact-answer"]
    )
    countries = [c for c, *_ in CAPITALS]
    return {countries[c.index]: c.klass for c in found.cases}


def test_the_demo_testset_shows_stable_flaky_regressed_and_fixed_cases(db):
    project = demo_load()
    testset = Testset.objects.get(project=project, slug="capitals")
    found = classes(testset)
    assert found["France"] == "stable_pass" and found["Turkey"] == "stable_fail"
    assert found["Spain"] == "flaky" and found["Germany"] == "regressed"
    assert found["Brazil"] == "fixed"
    runs = Run.objects.filter(project=project, tags__contains={"branch": "main"})
    assert runs.count() == 3
    demo_load()
    assert Run.objects.filter(project=project).count() == 5


def test_an_older_demo_testset_gets_the_later_answers_as_a_new_version(db, owner):
    project = project_create(name="Demo", slug="demo", owner=owner)
    older = [
        {"country": c, "correct_answer": capital, "outputs": v1, "outputs_v2": v2}
        for c, capital, v1, v2 in CAPITALS
    ]
    testsets.testset_create(project=project, name="Capitals", slug="capitals", rows=older)
    demo_load()
    testset = Testset.objects.get(project=project, slug="capitals")
    assert testset.head.version == 2 and "outputs_v5" in testset.head.columns
    assert classes(testset)["Germany"] == "regressed"
