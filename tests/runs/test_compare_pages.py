"""The compare page (full and its aligned-rows fragment), the run picker, the refusals shown on
the page, the comparison API, and isolation between projects."""

from __future__ import annotations

import pytest

from runs.views import compare as compare_views
from tests.runs.test_compare import JUDGE_SCHEMA, questions, scored_run, scores

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "compare-rows"}


@pytest.fixture
def judge(project):
    from evaluators.services import evaluator_create

    return evaluator_create(
        project=project, kind="feedback", name="Judge", slug="judge", outputs_schema=JUDGE_SCHEMA
    )


@pytest.fixture
def pair(project, judge):
    version = questions(project, 4)
    base = scored_run(project, version, judge.head, scores([0.2, 0.5, 0.9, "boom"]), "Base run")
    cand = scored_run(project, version, judge.head, scores([0.4, 0.5, 0.6, 0.7]), "Cand run")
    return base, cand


def url(base, cand, extra: str = "") -> str:
    return f"/p/acme/runs/compare?runs={base.pk},{cand.pk}{extra}"


def test_it_renders_cards_tests_and_aligned_rows(viewer_client, pair):
    base, cand = pair
    response = viewer_client.get(url(base, cand))
    page = response.content.decode()
    assert response.status_code == 200 and "<html" in page
    assert "judge.score" in page and "judge.success" in page and "higher is better" in page
    assert "paired bootstrap" in page and "mcnemar" in page and "3 pairs" in page
    assert ": p = 1 over 3 pairs" in page  # each p-value with its pairs
    assert "1 with an error" in page  # the baseline's errored cell, left out
    assert (
        'id="compare-rows"' in page and "Base run answer 2" in page and "Cand run answer 2" in page
    )
    assert 'class="delta-down">\u22120.3<' in page and 'class="delta-up">+0.2<' in page
    assert "data-chart=" in page and "Export CSV" in page
    assert f"compare/export?runs={base.pk}%2C{cand.pk}&amp;format=csv" in page


@pytest.mark.parametrize(
    ("p_value", "shown"), [(0.0123456, "= 0.0123"), (0.0, "< 1e-300"), (None, "= —")]
)
def test_a_p_value_too_small_for_a_double_never_reads_as_zero(p_value, shown):
    """A million pairs with a clear difference: the p-value underflows to 0.0, which is not a
    probability the test can give; the page says how small it is instead."""
    test = {"verdict": "better", "difference": 0.01, "ci": [0.005, 0.015], "p_value": p_value}
    test |= {"n": 10**6, "excluded": {}, "test": "mcnemar", "method": "chi-square"}
    assert compare_views._test_display(test, binary=True)["p_value"] == shown


def test_it_swaps_only_the_rows_for_htmx(viewer_client, pair):
    base, cand = pair
    response = viewer_client.get(url(base, cand, "&metric=judge.score&filter=regressions"), **HTMX)
    fragment = response.content.decode()
    assert fragment.strip().startswith('<section class="card flush" id="compare-rows"')
    assert "<html" not in fragment and "metric-card" not in fragment
    assert "1 row" in fragment and "regressions vs #" in fragment
    assert "Base run answer 2" in fragment and "Base run answer 0" not in fragment


@pytest.mark.parametrize(
    ("show", "present", "absent"),
    [
        ("improvements", ["answer 0"], ["answer 1", "answer 2"]),
        ("changed", ["answer 0", "answer 2", "answer 3"], ["answer 1"]),
    ],
)
def test_it_filters_rows_on_the_page(viewer_client, pair, show, present, absent):
    base, cand = pair
    page = viewer_client.get(url(base, cand, f"&metric=judge.score&filter={show}")).content.decode()
    table = page[page.index('id="compare-rows"') :]
    assert all(f"Base run {text}" in table for text in present)
    assert not any(f"Base run {text}" in table for text in absent)


def test_it_paginates_the_aligned_rows(viewer_client, project, judge):
    version = questions(project, 60)
    runs = [scored_run(project, version, judge.head, scores([0.5] * 60), n) for n in "ab"]
    page = viewer_client.get(url(*runs)).content.decode()
    assert "Page 1 of 2" in page and "a answer 49" in page and "a answer 50" not in page
    second = viewer_client.get(url(*runs, "&page=2"), **HTMX).content.decode()
    assert "a answer 50" in second and "a answer 59" in second and "Page 2 of 2" in second
    past_the_end = viewer_client.get(url(*runs, "&page=9"), **HTMX).content.decode()
    assert "a answer 59" in past_the_end and "Page 2 of 2" in past_the_end


def test_it_offers_finished_runs_to_pick(viewer_client, pair):
    page = viewer_client.get("/p/acme/runs/compare").content.decode()
    assert 'name="runs"' in page and 'name="baseline"' in page
    assert "Base run" in page and "Cand run" in page and 'id="compare-rows"' not in page


def test_it_accepts_the_picker_form_with_repeated_runs(viewer_client, pair):
    base, cand = pair
    page = viewer_client.get(
        f"/p/acme/runs/compare?runs={base.pk}&runs={cand.pk}&baseline={cand.pk}"
    ).content.decode()
    assert f'baseline <a href="/p/acme/runs/{cand.pk}/">#{cand.pk} Cand run</a>' in page


def test_it_explains_why_it_refuses_on_the_page(viewer_client, project, judge, pair):
    other = scored_run(project, questions(project, 1, "other"), judge.head, scores([0.1]), "X")
    page = viewer_client.get(url(pair[0], other)).content.decode()
    assert "different testsets" in page and 'id="compare-rows"' not in page
    ids = ",".join(str(i) for i in range(1, 12))
    assert (
        "at most 10 runs" in viewer_client.get(f"/p/acme/runs/compare?runs={ids}").content.decode()
    )


def test_it_hides_other_projects_runs(outsider_client, pair):
    base, cand = pair
    assert outsider_client.get(url(base, cand)).status_code == 404
    assert outsider_client.get(f"/p/other/runs/compare?runs={base.pk},{cand.pk}").status_code == 404
    assert outsider_client.get(f"/p/acme/runs/{base.pk}/export?format=csv").status_code == 404


# --- the API ----------------------------------------------------------------------------------


def test_it_returns_the_comparison_with_statistics(viewer_api, pair):
    base, cand = pair
    response = viewer_api.get(f"/api/v1/runs/compare?runs={base.pk},{cand.pk}&limit=2")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["baseline"] == base.pk and body["alignment"] == "testcase index"
    assert [r["id"] for r in body["runs"]] == [base.pk, cand.pk] and body["runs"][0]["baseline"]
    score = next(m for m in body["metrics"] if m["metric"] == "judge.score")
    test = score["tests"][0]
    assert test["run"] == cand.pk and test["n"] == 3 and test["excluded"]["errors"] == 1
    assert test["difference"] == pytest.approx((0.2 + 0 - 0.3) / 3)
    assert test["verdict"] in ("better", "worse", "inconclusive") and len(test["ci"]) == 2
    assert body["count"] == 4 and [r["index"] for r in body["rows"]] == [0, 1]
    assert body["rows"][0]["runs"][1]["deltas"]["judge.score"] == pytest.approx(0.2)
    errored = viewer_api.get(
        f"/api/v1/runs/compare?runs={base.pk},{cand.pk}&offset=3&metric=judge.score"
    ).json()["rows"][0]["runs"][0]
    assert errored["errors"]["judge.score"]["code"] == "boom" and errored["values"] == {}


def test_it_refuses_bad_comparisons_through_the_api(viewer_api, project, judge, pair):
    other = scored_run(project, questions(project, 1, "other"), judge.head, scores([0.1]), "X")
    response = viewer_api.get(f"/api/v1/runs/compare?runs={pair[0].pk},{other.pk}")
    assert response.status_code == 400
    assert "different testsets" in response.json()["error"]["fields"]["runs"][0]
    ids = ",".join(str(i) for i in range(1, 12))
    too_many = viewer_api.get(f"/api/v1/runs/compare?runs={ids}").json()["error"]
    assert too_many["message"] == "runs: Compare at most 10 runs at once (you chose 11)."


def test_it_does_not_find_other_projects_runs_through_the_api(outsider_api, pair):
    base, cand = pair
    response = outsider_api.get(f"/api/v1/runs/compare?runs={base.pk},{cand.pk}")
    assert response.status_code == 404
