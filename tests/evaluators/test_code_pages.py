"""The code editor pages: the evaluator page and the new-evaluator page of a code evaluator, with
the preset loader, the playground running unsaved code, example cases and the sandbox banners."""

import json

import pytest

from evaluators.models import Evaluator, EvaluatorRevision
from evaluators.services import evaluator_create

HTMX = {"HTTP_HX_REQUEST": "true"}
PAGE = "/p/acme/evaluators/checker/"
SAMPLE = {"inputs": '{"correct_answer": "Paris"}', "outputs": '"Paris"', "trace": "null"}
BROKEN = "def evaluate(inputs, outputs, trace):\n    return (1 +\n"
EXAMPLES = [
    {"name": "right", "inputs": {"correct_answer": "Paris"}, "outputs": "Paris",
     "expected": {"success": True}},
    {"name": "wrong", "inputs": {"correct_answer": "Paris"}, "outputs": "Lyon",
     "expected": {"success": True}},
]  # fmt: skip


@pytest.fixture
def checker(project):
    return evaluator_create(project=project, kind="code", name="Checker")


def _settings(code: str, runtime: str = "python", **extra) -> dict:
    return {"p__runtime": runtime, "p__code": code, "p__version": "2", **extra}


def _field_block(html: str, field_id: str) -> str:
    """The form row that holds ``field_id``: where its inline errors are."""
    start = html.rindex('<div class="form-row', 0, html.index(f'id="{field_id}"'))
    return html[start : html.index("</div>", html.index(f'id="{field_id}"'))]


# --- the evaluator page -------------------------------------------------------------------------


def test_it_shows_the_code_editor_with_runtime_switch_presets_and_playground(owner_client, checker):
    html = owner_client.get(PAGE).content.decode()
    assert "<html" in html
    assert 'data-editor-language-for="id_p__code"' in html
    assert 'data-editor="python"' in html and 'id="id_p__code"' in html
    assert '<input type="hidden" name="p__version" value="2"' in html
    assert 'hx-include="#settings-form"' in html and 'data-hotkey="Mod+Enter"' in html
    assert f'href="{PAGE}?preset=latency_check"' in html
    assert 'id="code-defaults"' in html  # the runtime switch's defaults
    assert "capital_qa" in html and "a1b2c3d4e5f60003" in html  # the sample trace
    assert 'id="sandbox-status"' in html and "bubblewrap sandbox" in html


def test_it_loads_a_preset_into_the_editor_without_saving(owner_client, checker):
    html = owner_client.get(f"{PAGE}?preset=latency_check").content.decode()
    assert "<html" in html and "MAX_LATENCY_MS" in html
    assert "Loaded the preset <strong>Latency Check</strong>" in html
    assert checker.revisions.count() == 1


def test_it_swaps_only_the_settings_when_htmx_loads_a_preset(owner_client, checker):
    html = owner_client.get(f"{PAGE}?preset=javascript_default", **HTMX).content.decode()
    assert html.strip().startswith('<section class="card" id="code-settings"')
    assert "<html" not in html and "module.exports" in html
    assert '<option value="javascript" selected>' in html


def test_it_runs_the_unsaved_code_in_the_playground(owner_client, checker):
    code = "def evaluate(inputs, outputs, trace):\n    print('unsaved!')\n    return 0.25\n"
    response = owner_client.post(f"{PAGE}try", {**SAMPLE, **_settings(code)}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200
    assert html.strip().startswith('<section class="card playground" id="try-panel"')
    assert "<html" not in html
    assert "&quot;score&quot;: 0.25" in html and "&quot;success&quot;: false" in html
    assert "unsaved!" in html and " ms</span>" in html and "ran the editor's code" in html
    assert checker.revisions.count() == 1


def test_it_runs_the_saved_code_in_the_playground_without_javascript(owner_client, checker):
    response = owner_client.post(f"{PAGE}try", SAMPLE)
    html = response.content.decode()
    assert "<html" in html and 'id="code-settings"' in html
    assert "&quot;score&quot;: 1.0" in html and checker.head.slug in html


def test_it_shows_an_error_with_its_stack_trace_in_the_playground(owner_client, checker):
    code = "def evaluate(inputs, outputs, trace):\n    return inputs['missing']\n"
    html = owner_client.post(f"{PAGE}try", {**SAMPLE, **_settings(code)}, **HTMX).content.decode()
    assert 'class="error-box"' in html and "KeyError" in html
    assert "Stack trace" in html and "line 2" in html


@pytest.mark.parametrize("runtime", ["javascript", "typescript"])
def test_it_runs_javascript_and_typescript_in_the_playground(owner_client, checker, runtime):
    code = "export async function evaluate(inputs: any, outputs: any) {\n  return {hit: outputs === inputs.correct_answer};\n}\n"
    if runtime == "javascript":
        code = code.replace(": any", "")
    html = owner_client.post(
        f"{PAGE}try", {**SAMPLE, **_settings(code, runtime)}, **HTMX
    ).content.decode()
    assert "&quot;hit&quot;: true" in html


def test_it_refuses_to_try_invalid_settings(owner_client, checker):
    settings = _settings("def evaluate(i, o, t):\n    return 1\n", p__timeout_s="600")
    response = owner_client.post(f"{PAGE}try", {**SAMPLE, **settings}, **HTMX)
    assert response.status_code == 400
    assert "Fix the settings before trying them" in response.content.decode()


def test_it_shows_a_viewer_the_code_but_not_the_playground(viewer_client, checker):
    # The playground runs code: editors only (docs/security.md, Roles).
    html = viewer_client.get(PAGE).content.decode()
    assert 'id="try-panel"' in html and "needs the editor role" in html
    assert "Save as new revision" not in html
    response = viewer_client.post(f"{PAGE}try", {**SAMPLE, **_settings("def evaluate(i, o, t): return True")}, **HTMX)  # fmt: skip
    assert response.status_code == 403


def test_it_shows_a_syntax_error_on_the_code_field_and_saves_nothing(owner_client, checker):
    response = owner_client.post(f"{PAGE}save", _settings(BROKEN, message="oops"))
    html = response.content.decode()
    assert response.status_code == 400
    block = _field_block(html, "id_p__code")
    assert 'class="field-error"' in block and "line 2" in block and "SyntaxError" in block
    assert "(1 +" in block  # the broken code stays in the editor
    assert checker.revisions.count() == 1


def test_it_saves_code_and_example_cases_and_shows_their_report(owner_client, checker):
    code = "def evaluate(inputs, outputs, trace):\n    return outputs == inputs['correct_answer']\n"
    data = _settings(code, examples=json.dumps(EXAMPLES), message="with cases")
    assert owner_client.post(f"{PAGE}save", data).status_code == 302
    head = Evaluator.objects.get(slug="checker").head
    assert (head.version, head.parameters["code"], len(head.examples)) == (2, code, 2)
    html = owner_client.get(PAGE).content.decode()
    assert "1 pass</span>" in html and "1 fail</span>" in html
    assert "success False, expected True" in html
    assert '<details class="advanced" id="code-examples" open>' in html


def test_it_keeps_the_example_cases_when_the_form_does_not_send_them(owner_client, project):
    evaluator_create(project=project, kind="code", name="Checker", examples=EXAMPLES[:1])
    data = _settings("def evaluate(inputs, outputs, trace):\n    return True\n")
    assert owner_client.post(f"{PAGE}save", data).status_code == 302
    assert Evaluator.objects.get(slug="checker").head.examples == EXAMPLES[:1]


@pytest.mark.parametrize(
    ("examples", "message"),
    [
        ("{oops", "Not valid JSON"),
        ('{"inputs": {}}', "Give a JSON list of cases"),
        ('[{"inputs": {}, "expected": {"bogus": 1}}]', "examples.0.expected: give success"),
    ],
)
def test_it_shows_bad_example_cases_on_their_field(owner_client, checker, examples, message):
    code = "def evaluate(inputs, outputs, trace):\n    return True\n"
    response = owner_client.post(f"{PAGE}save", _settings(code, examples=examples))
    assert response.status_code == 400
    assert message in _field_block(response.content.decode(), "id_examples")
    assert checker.revisions.count() == 1


def test_it_offers_interface_v2_to_a_legacy_v1_evaluator(owner_client, checker):
    legacy = {k: v for k, v in checker.head.parameters.items() if k != "version"}
    legacy["code"] = "def evaluate(app_params, inputs, output, correct_answer):\n    return True\n"
    EvaluatorRevision.objects.filter(pk=checker.head.pk).update(parameters=legacy)
    html = owner_client.get(PAGE).content.decode()
    assert "legacy interface v1" in html and 'name="p__version" value="2"' in html
    code = "def evaluate(inputs, outputs, trace):\n    return True\n"
    data = {"p__runtime": "python", "p__code": code, "p__version": ["", "2"]}
    assert owner_client.post(f"{PAGE}save", data).status_code == 302
    assert Evaluator.objects.get(slug="checker").head.parameters["version"] == "2"


def test_it_keeps_a_legacy_evaluator_on_v1_when_nothing_says_otherwise(owner_client, checker):
    legacy = {k: v for k, v in checker.head.parameters.items() if k != "version"}
    EvaluatorRevision.objects.filter(pk=checker.head.pk).update(parameters=legacy)
    code = "def evaluate(app_params, inputs, output, correct_answer):\n    return 1\n"
    data = {"p__runtime": "python", "p__code": code, "p__version": ""}
    assert owner_client.post(f"{PAGE}save", data).status_code == 302
    assert Evaluator.objects.get(slug="checker").head.parameters["version"] is None


def test_it_warns_loudly_when_code_runs_without_a_sandbox(owner_client, checker, settings):
    settings.EVALSITE_CODE_RUNNER = "inprocess"
    html = owner_client.get(PAGE).content.decode()
    assert '<div class="message-warning mb" role="alert" id="sandbox-status">' in html
    assert "No sandbox" in html


def test_it_shows_a_banner_when_the_sandbox_is_unavailable(owner_client, checker, settings):
    settings.EVALSITE_SANDBOX_BWRAP = "/nowhere/bwrap"
    html = owner_client.get(PAGE).content.decode()
    assert '<div class="message-error mb" role="alert" id="sandbox-status">' in html
    assert "cannot run here" in html and "bwrap not found at /nowhere/bwrap" in html


def test_it_keeps_other_kinds_on_the_plain_settings_page(owner_client, project):
    evaluator_create(project=project, kind="regex", name="R", parameters={"pattern": "a"})
    html = owner_client.get("/p/acme/evaluators/r/").content.decode()
    assert "Try it" in html and "Playground" not in html and "sandbox-status" not in html


# --- the new-evaluator page ---------------------------------------------------------------------

NEW = "/p/acme/evaluators/new?kind=code"


def test_it_opens_the_code_editor_for_a_new_code_evaluator(owner_client, project):
    html = owner_client.get(NEW).content.decode()
    assert 'data-editor-language-for="id_p__code"' in html and 'id="try-panel"' in html
    assert '<input type="hidden" name="p__version" value="2"' in html
    assert 'href="?kind=code&amp;preset=token_budget"' in html
    assert 'name="playground" value="1"' in html and 'id="id_examples"' in html


def test_it_opens_a_preset_on_the_new_page(owner_client, project):
    html = owner_client.get(f"{NEW}&preset=typescript_default").content.decode()
    assert '<option value="typescript" selected>' in html and 'data-editor="typescript"' in html


def test_it_runs_the_playground_on_the_new_page_as_a_fragment(owner_client, project):
    code = "def evaluate(inputs, outputs, trace):\n    return {'n': len(outputs)}\n"
    data = {"kind": "code", "playground": "1", "name": "Mine", **SAMPLE, **_settings(code)}
    response = owner_client.post(NEW, data, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert html.strip().startswith('<section class="card playground" id="try-panel"')
    assert "&quot;n&quot;: 5" in html
    assert not Evaluator.objects.exists()


def test_it_runs_the_playground_on_the_new_page_without_javascript(owner_client, project):
    data = {"kind": "code", "playground": "1", **SAMPLE}
    html = owner_client.post(f"{NEW}&preset=multi_metric", data).content.decode()
    assert "<html" in html and "&quot;label&quot;: &quot;exact&quot;" in html
    assert not Evaluator.objects.exists()


def test_it_creates_a_code_evaluator_on_interface_v2_with_example_cases(owner_client, project):
    code = "def evaluate(inputs, outputs, trace):\n    return outputs == inputs['correct_answer']\n"
    data = {"kind": "code", "name": "Mine", "examples": json.dumps(EXAMPLES), **_settings(code)}
    del data["p__version"]  # the default a new evaluator starts from, not what the form sent
    assert owner_client.post(NEW, data).status_code == 302
    head = Evaluator.objects.get(slug="mine").head
    assert head.parameters["version"] == "2" and len(head.examples_report) == 2


def test_it_shows_a_syntax_error_on_the_code_field_of_the_new_page(owner_client, project):
    response = owner_client.post(NEW, {"kind": "code", "name": "Broken", **_settings(BROKEN)})
    block = _field_block(response.content.decode(), "id_p__code")
    assert "line 2" in block and 'class="field-error"' in block
    assert not Evaluator.objects.exists()
