"""Small builders for run tests (testsets straight into the tables, no upload parsing)."""

from __future__ import annotations

from runs.models import Testcase, Testset, TestsetVersion


def make_testset(project, rows: list[dict], slug: str = "capitals") -> TestsetVersion:
    testset = Testset.objects.create(project=project, slug=slug, name=slug.title())
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    version = TestsetVersion.objects.create(
        project=project, testset=testset, version=1, columns=columns, row_count=len(rows)
    )
    Testcase.objects.bulk_create(
        Testcase(project=project, version=version, index=i, data=row) for i, row in enumerate(rows)
    )
    testset.head = version
    testset.save(update_fields=["head"])
    return version


CAPITALS = [
    {"country": "France", "correct_answer": "Paris", "outputs": "Paris"},
    {"country": "Germany", "correct_answer": "Berlin", "outputs": "Berlin"},
    {"country": "Italy", "correct_answer": "Rome", "outputs": "Milan"},
    {"country": "Spain", "correct_answer": "Madrid", "outputs": "I'm sorry, I don't know."},
]
