"""Evaluator pages, full and as HTMX fragments."""

from evaluators.models import Evaluator
from evaluators.services import evaluator_create, evaluator_revise

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_it_lists_evaluators_with_search_and_kind_filter(owner_client, project):
    evaluator_create(project=project, kind="regex", name="Digits", parameters={"pattern": r"\d"})
    evaluator_create(project=project, kind="exact_match", name="Exact")
    page = owner_client.get("/p/acme/evaluators/?kind=regex").content.decode()
    assert "Digits" in page and "<html" in page
    assert ">Exact<" not in page


def test_it_swaps_only_the_table_for_htmx(owner_client, project):
    evaluator_create(project=project, kind="regex", name="Digits", parameters={"pattern": r"\d"})
    fragment = owner_client.get("/p/acme/evaluators/?q=dig", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="evaluator-table">')
    assert "Digits" in fragment and "<html" not in fragment


def test_it_offers_kinds_then_presets_then_creates(owner_client, project):
    assert "Regex" in owner_client.get("/p/acme/evaluators/new").content.decode()
    page = owner_client.get("/p/acme/evaluators/new?kind=regex&preset=starts_with").content.decode()
    assert "^Answer:" in page
    response = owner_client.post(
        "/p/acme/evaluators/new?kind=regex",
        {
            "kind": "regex",
            "name": "Starts",
            "p__pattern": "^A",
            "p__should_match": "on",
            "p__case_sensitive": "on",
        },
    )
    assert response.status_code == 302
    assert Evaluator.objects.get(slug="starts").head.parameters == {
        "pattern": "^A",
        "should_match": True,
        "case_sensitive": True,
        "timeout_s": 1.0,
    }


def test_it_shows_a_bad_regex_inline_and_saves_nothing(owner_client, project):
    response = owner_client.post(
        "/p/acme/evaluators/new?kind=regex", {"kind": "regex", "name": "Bad", "p__pattern": "("}
    )
    assert response.status_code == 200
    assert "not a valid regular expression" in response.content.decode()
    assert not Evaluator.objects.exists()


def test_it_saves_settings_as_a_new_revision(owner_client, project):
    evaluator_create(project=project, kind="regex", name="R", parameters={"pattern": "a"})
    response = owner_client.post(
        "/p/acme/evaluators/r/save", {"p__pattern": "b", "message": "now b"}
    )
    assert response.status_code == 302
    head = Evaluator.objects.get(slug="r").head
    assert (head.version, head.parameters["pattern"], head.message) == (2, "b", "now b")


def test_it_forbids_a_viewer_to_save(viewer_client, project):
    evaluator_create(project=project, kind="regex", name="R", parameters={"pattern": "a"})
    assert viewer_client.post("/p/acme/evaluators/r/save", {"p__pattern": "b"}).status_code == 403
    assert Evaluator.objects.get(slug="r").head.version == 1


def test_it_runs_try_it_as_a_fragment(owner_client, project):
    evaluator_create(project=project, kind="exact_match", name="E")
    response = owner_client.post(
        "/p/acme/evaluators/e/try",
        {"inputs": '{"correct_answer": "Paris"}', "outputs": '"Paris"', "trace": "null"},
        **HTMX,
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.strip().startswith('<section class="card" id="try-panel">')
    assert "badge-success" in html and "&quot;success&quot;: true" in html


def test_it_runs_try_it_without_javascript(owner_client, project):
    evaluator_create(project=project, kind="exact_match", name="E")
    response = owner_client.post(
        "/p/acme/evaluators/e/try",
        {"inputs": '{"country": "France"}', "outputs": '"Paris"', "trace": "null"},
    )
    html = response.content.decode()
    assert "<html" in html and "missing_ground_truth" in html


def test_it_shows_invalid_json_in_try_it_inline(owner_client, project):
    evaluator_create(project=project, kind="exact_match", name="E")
    response = owner_client.post(
        "/p/acme/evaluators/e/try", {"inputs": "{oops", "outputs": '"x"'}, **HTMX
    )
    assert response.status_code == 400
    assert "Not valid JSON" in response.content.decode()


def test_it_diffs_two_revisions(owner_client, project):
    evaluator = evaluator_create(
        project=project, kind="regex", name="R", parameters={"pattern": "a"}
    )
    evaluator_revise(evaluator=evaluator, parameters={"pattern": "b"})
    fragment = owner_client.get("/p/acme/evaluators/r/diff?a=1&b=2", **HTMX).content.decode()
    assert '<span class="removed">-  &quot;pattern&quot;: &quot;a&quot;' in fragment
    assert "<html" not in fragment
    assert "<html" in owner_client.get("/p/acme/evaluators/r/diff?a=1&b=2").content.decode()


def test_it_hides_evaluators_of_other_projects(outsider_client, project):
    evaluator_create(project=project, kind="regex", name="R", parameters={"pattern": "a"})
    assert outsider_client.get("/p/acme/evaluators/r/").status_code == 404
