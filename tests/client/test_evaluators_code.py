"""`evalsite evaluators pull|diff|push` against a live evalsite: a folder of YAML files (a regex,
a code evaluator with its .py file, an LLM judge with its prompt file, a webhook with a sealed
header from the environment) pushed, pushed again, changed, pulled, diffed, refused."""

from __future__ import annotations

import argparse
import textwrap

import pytest
import yaml
from evalsite_client import cli, evaluators_code

from evaluators import crypto
from evaluators.models import Evaluator, EvaluatorRevision
from evaluators.services import evaluation_invoke, evaluator_create
from tests.servers import Reply

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "Bearer hook-s3cret-42"

CODE = """\
def evaluate(inputs, outputs, trace):
    return outputs == inputs["correct_answer"]
"""

PROMPT = """\
The capital of {{inputs.country}} is {{inputs.correct_answer}}.
Grade this answer from 0 to 1: {{outputs}}
"""

FILES = {
    "capital.yaml": """\
        slug: capital
        name: Capital
        kind: regex
        parameters:
          pattern: ^Par
        examples:
          - name: paris
            inputs: {}
            outputs: Paris
            expected: {success: true}
        """,
    "exact.yaml": """\
        slug: exact
        name: Exact answer
        description: |
          The output equals the testcase's correct_answer.
          Written in Python.
        kind: code
        parameters:
          runtime: python
          code: {file: exact.py}
        outputs_schema:
          type: object
          properties:
            success: {type: boolean}
          required: [success]
        examples:
          - name: right
            inputs: {correct_answer: Paris}
            outputs: Paris
            expected: {success: true}
          - name: wrong
            inputs: {correct_answer: Paris}
            outputs: Rome
            expected: {success: false}
        """,
    "judge.yaml": """\
        slug: judge
        name: Correctness judge
        kind: llm_judge
        parameters:
          connection: local
          messages:
            - role: system
              content: You grade answers.
            - role: user
              content: {file: judge.user.txt}
        examples:
          - name: right
            inputs: {country: France, correct_answer: Paris}
            outputs: Paris
            expected: {success: true}
        """,
    "hook.yaml": """\
        slug: hook
        name: Hook
        kind: webhook
        parameters:
          url: URL/grade
          headers:
            Authorization: {env: HOOK_TOKEN}
        examples:
          - name: graded
            inputs: {}
            outputs: Paris
            expected: {success: true}
        """,
}


@pytest.fixture
def hook(http_server, settings, monkeypatch):
    """The webhook's server, reachable on 127.0.0.1, and its token in the environment."""
    settings.EVALSITE_WEBHOOK_ALLOW_PRIVATE = True
    http_server.handler = lambda request: Reply(200, {"success": True})
    monkeypatch.setenv("HOOK_TOKEN", SECRET)
    return http_server


@pytest.fixture
def folder(tmp_path, hook, llm_connection):
    """A repository's evaluators/ folder with the four evaluators and their text files."""
    root = tmp_path / "evaluators"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(textwrap.dedent(text).replace("URL", hook.url))
    (root / "exact.py").write_text(CODE)
    (root / "judge.user.txt").write_text(PROMPT)
    return root


def evalsite(client, command, folder, *extra) -> int:
    """``evalsite evaluators <command> --dir <folder> ...`` in this process, on ``client``."""
    parser = argparse.ArgumentParser()
    evaluators_code.register(parser.add_subparsers())
    args = parser.parse_args(["evaluators", command, "--dir", str(folder), *extra])
    return args.func(args, client)


def versions() -> dict[str, int]:
    return {e.slug: e.head.version for e in Evaluator.objects.select_related("head")}


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# --- push -------------------------------------------------------------------------------------


def test_it_creates_every_evaluator_of_a_folder(remote, folder, capsys):
    assert evalsite(remote, "push", folder) == 0

    out = capsys.readouterr().out
    assert versions() == {"capital": 1, "exact": 1, "judge": 1, "hook": 1}
    heads = {e.slug: e.head for e in Evaluator.objects.select_related("head")}
    assert heads["exact"].parameters["code"] == CODE
    assert heads["exact"].parameters["version"] == "2"  # the kind's default for new ones
    assert heads["exact"].schemas["outputs"]["required"] == ["success"]
    assert heads["judge"].parameters["messages"][1] == {"role": "user", "content": PROMPT}
    assert crypto.unseal(heads["hook"].parameters["headers"]["Authorization"]) == SECRET
    assert all(case["passed"] for head in heads.values() for case in head.examples_report)
    assert "created exact (exact-v1)" in out
    assert "examples: 2 of 2 passed" in out
    assert "created 4, revised 0, updated 0, unchanged 0, failed 0" in out


def test_a_second_push_creates_nothing(remote, folder, capsys):
    evalsite(remote, "push", folder)
    count = EvaluatorRevision.objects.count()

    assert evalsite(remote, "push", folder) == 0

    assert EvaluatorRevision.objects.count() == count == 4
    out = capsys.readouterr().out
    assert "created 0, revised 0, updated 0, unchanged 4, failed 0" in out


def test_a_changed_file_makes_exactly_one_revision_of_that_evaluator(remote, folder, capsys):
    evalsite(remote, "push", folder)
    edit(folder / "exact.py", "outputs ==", "outputs.strip() ==")

    assert evalsite(remote, "push", folder) == 0

    assert versions() == {"capital": 1, "exact": 2, "judge": 1, "hook": 1}
    assert EvaluatorRevision.objects.count() == 5
    head = Evaluator.objects.get(slug="exact").head
    assert "outputs.strip()" in head.parameters["code"]
    assert head.message == "evalsite evaluators push (exact.yaml)"
    assert "revised exact: exact-v1 -> exact-v2 (parameters)" in capsys.readouterr().out
    assert evalsite(remote, "push", folder) == 0
    assert EvaluatorRevision.objects.count() == 5


def test_a_name_change_updates_the_evaluator_without_a_revision(remote, folder, capsys):
    evalsite(remote, "push", folder)
    edit(folder / "capital.yaml", "name: Capital", "name: Capital city")

    assert evalsite(remote, "push", folder, "capital") == 0

    assert Evaluator.objects.get(slug="capital").name == "Capital city"
    assert EvaluatorRevision.objects.count() == 4
    assert "updated capital (name/description; no new revision)" in capsys.readouterr().out


def test_it_refuses_a_failing_example_case_and_saves_nothing(remote, folder, capsys):
    edit(folder / "capital.yaml", "outputs: Paris", "outputs: Rome")

    assert evalsite(remote, "push", folder, "capital") == 2

    err = capsys.readouterr().err
    assert "examples.0: paris: success False, expected True" in err
    assert "nothing was saved for capital" in err
    assert not Evaluator.objects.exists()


def test_it_refuses_a_revision_whose_example_fails_unless_allowed(remote, folder, capsys):
    evalsite(remote, "push", folder, "capital")
    edit(folder / "capital.yaml", "pattern: ^Par", "pattern: ^Rom")

    assert evalsite(remote, "push", folder, "capital") == 2
    assert versions() == {"capital": 1}
    assert "examples.0: paris: success False" in capsys.readouterr().err

    assert evalsite(remote, "push", folder, "capital", "--allow-failing") == 0
    assert versions() == {"capital": 2}
    assert "warning: paris: success False, expected True" in capsys.readouterr().out


def test_it_names_an_invalid_parameter_and_its_file_and_saves_nothing(remote, folder, capsys):
    (folder / "exact.py").write_text("def evaluate(inputs, outputs, trace)\n    return True\n")
    edit(folder / "capital.yaml", "pattern: ^Par", "pattern: ^(Par")

    assert evalsite(remote, "push", folder, "capital", "exact") == 2

    err = capsys.readouterr().err
    assert f"parameters.code (in {folder / 'exact.py'}): line 1" in err
    assert "parameters.pattern:" in err
    assert not Evaluator.objects.exists()


def test_it_refuses_a_folder_with_a_bad_file_before_sending_anything(remote, folder, capsys):
    edit(folder / "judge.yaml", "content: {file: judge.user.txt}", "content: {file: ../x.txt}")

    assert evalsite(remote, "push", folder) == 2

    assert "is outside" in capsys.readouterr().err
    assert not Evaluator.objects.exists()


def test_it_says_which_environment_variable_is_missing(remote, folder, monkeypatch, capsys):
    monkeypatch.delenv("HOOK_TOKEN")

    assert evalsite(remote, "push", folder) == 2

    assert "the environment variable HOOK_TOKEN is not set" in capsys.readouterr().err
    assert not Evaluator.objects.exists()


# --- diff -------------------------------------------------------------------------------------


def test_diff_shows_what_would_change_and_exits_1_then_0_when_clean(remote, folder, capsys):
    assert evalsite(remote, "diff", folder) == 1
    assert "create 4, update 0, unchanged 0" in capsys.readouterr().out

    evalsite(remote, "push", folder)
    capsys.readouterr()
    assert evalsite(remote, "diff", folder) == 0
    assert "create 0, update 0, unchanged 4" in capsys.readouterr().out

    edit(folder / "exact.py", "outputs ==", "outputs.strip() ==")
    assert evalsite(remote, "diff", folder) == 1
    out = capsys.readouterr().out
    assert "--- server: exact (exact-v1)" in out
    assert '-        return outputs == inputs["correct_answer"]' in out
    assert '+        return outputs.strip() == inputs["correct_answer"]' in out
    assert "hook: parameters.headers.Authorization is a sealed value from the file" in out
    assert "create 0, update 1, unchanged 3" in out
    assert EvaluatorRevision.objects.count() == 4  # diff only reads


def test_the_evalsite_command_runs_diff(site, folder, capsys):
    argv = ["--url", site.url, "--api-key", site.key, "evaluators", "diff", "--dir", str(folder)]

    assert cli.main(argv) == 1

    assert "create 4, update 0, unchanged 0" in capsys.readouterr().out


# --- pull -------------------------------------------------------------------------------------


def test_pulled_files_push_back_as_no_change(remote, folder, tmp_path, capsys):
    evalsite(remote, "push", folder)
    pulled = tmp_path / "pulled"

    assert evalsite(remote, "pull", pulled) == 0

    names = sorted(p.name for p in pulled.iterdir())
    assert names == [
        "capital.yaml",
        "exact.py",
        "exact.yaml",
        "hook.yaml",
        "judge.user.txt",
        "judge.yaml",
    ]
    assert (pulled / "exact.py").read_text() == CODE
    assert (pulled / "judge.user.txt").read_text() == PROMPT
    exact = yaml.safe_load((pulled / "exact.yaml").read_text())
    assert exact["parameters"]["code"] == {"file": "exact.py"}
    assert (
        exact["description"]
        == "The output equals the testcase's correct_answer.\nWritten in Python."
    )
    hook = yaml.safe_load((pulled / "hook.yaml").read_text())
    assert hook["parameters"]["headers"] == {"Authorization": crypto.MASK}
    assert not any(SECRET in p.read_text() for p in pulled.iterdir())
    capsys.readouterr()

    assert evalsite(remote, "diff", pulled) == 0
    assert evalsite(remote, "push", pulled) == 0
    assert evalsite(remote, "pull", pulled) == 0
    assert EvaluatorRevision.objects.count() == 4
    assert "Pulled 4 evaluator(s); 0 file(s) written." in capsys.readouterr().out


def test_pull_then_push_is_a_no_op_for_evaluators_made_on_the_site(
    remote, project, hook, llm_connection, tmp_path, capsys
):
    schema = {"type": "object", "properties": {"success": {"type": "boolean"}}}
    evaluator_create(project=project, kind="exact_match", name="Plain")
    evaluator_create(project=project, kind="code", name="Latency", preset="latency_check")
    evaluator_create(
        project=project,
        kind="regex",
        name="Given",
        parameters={"pattern": "a"},
        outputs_schema=schema,
    )
    evaluator_create(
        project=project,
        kind="llm_judge",
        name="Labels",
        parameters={
            "connection": "local",
            "template_format": "jinja2",
            "score_type": "categorical",
            "categories": [{"label": "good", "score": 1}, {"label": "bad", "score": 0}],
        },
    )
    evaluator_create(
        project=project,
        kind="webhook",
        name="Site hook",
        parameters={"url": f"{hook.url}/x", "headers": {"X-Key": "k-123"}},
    )
    count = EvaluatorRevision.objects.count()

    assert evalsite(remote, "pull", tmp_path / "evaluators") == 0

    given = yaml.safe_load((tmp_path / "evaluators" / "given.yaml").read_text())
    labels = yaml.safe_load((tmp_path / "evaluators" / "labels.yaml").read_text())
    assert given["outputs_schema"] == schema  # given, so written
    assert "outputs_schema" not in labels  # derived from the parameters, so not
    assert labels["parameters"]["messages"][1]["content"] == {"file": "labels.user.jinja"}
    assert (tmp_path / "evaluators" / "latency.py").exists()
    assert evalsite(remote, "diff", tmp_path / "evaluators") == 0
    assert evalsite(remote, "push", tmp_path / "evaluators") == 0
    assert EvaluatorRevision.objects.count() == count
    assert "unchanged 5, failed 0" in capsys.readouterr().out


def test_pull_keeps_a_files_own_code_file_name_and_env_reference(remote, folder, capsys):
    evalsite(remote, "push", folder)
    (folder / "exact.py").rename(folder / "exact_eval.py")
    edit(folder / "exact.yaml", "{file: exact.py}", "{file: exact_eval.py}")

    assert evalsite(remote, "pull", folder) == 0

    assert not (folder / "exact.py").exists()
    assert (folder / "exact_eval.py").read_text() == CODE
    hook = yaml.safe_load((folder / "hook.yaml").read_text())
    assert hook["parameters"]["headers"] == {"Authorization": {"env": "HOOK_TOKEN"}}


# --- secrets and schemas ----------------------------------------------------------------------


def test_the_sealed_header_survives_pull_and_push(remote, folder, hook, tmp_path, monkeypatch):
    evalsite(remote, "push", folder, "hook")
    stored = Evaluator.objects.get(slug="hook").head.parameters["headers"]["Authorization"]
    monkeypatch.delenv("HOOK_TOKEN")
    evalsite(remote, "pull", tmp_path / "pulled", "hook")

    assert evalsite(remote, "push", tmp_path / "pulled") == 0

    head = Evaluator.objects.get(slug="hook").head
    assert (head.version, head.parameters["headers"]["Authorization"]) == (1, stored)
    hook.requests.clear()
    result = evaluation_invoke(revision=head, inputs={}, outputs="Paris")
    assert result.status == "success", result.error
    assert hook.requests[0].headers["Authorization"] == SECRET


def test_a_new_secret_in_the_environment_makes_one_revision(remote, folder, monkeypatch, capsys):
    evalsite(remote, "push", folder, "hook")
    monkeypatch.setenv("HOOK_TOKEN", "Bearer rotated-7")

    assert evalsite(remote, "push", folder, "hook") == 0
    assert evalsite(remote, "push", folder, "hook") == 0

    head = Evaluator.objects.get(slug="hook").head
    assert head.version == 2
    assert crypto.unseal(head.parameters["headers"]["Authorization"]) == "Bearer rotated-7"
    assert "revised hook: hook-v1 -> hook-v2 (a sealed value)" in capsys.readouterr().out


def test_null_outputs_schema_goes_back_to_the_kinds_own(remote, folder, capsys):
    edit(folder / "capital.yaml", "kind: regex", "kind: regex\noutputs_schema: {type: object}")
    evalsite(remote, "push", folder, "capital")
    assert Evaluator.objects.get(slug="capital").head.schemas["outputs"] == {"type": "object"}

    edit(folder / "capital.yaml", "outputs_schema: {type: object}", "description: same rules")
    assert evalsite(remote, "diff", folder, "capital") == 1  # only the description: kept schema
    assert "-outputs_schema" not in capsys.readouterr().out
    edit(folder / "capital.yaml", "description: same rules", "outputs_schema: null")

    assert evalsite(remote, "push", folder, "capital") == 0

    head = Evaluator.objects.get(slug="capital").head
    assert head.version == 2
    assert head.schemas["outputs"]["required"] == ["success"]
    assert evalsite(remote, "diff", folder, "capital") == 0


def test_a_file_that_differs_only_in_form_makes_no_revision(remote, folder, capsys):
    # A few-shot example without its note: the server fills note: "" in, so the file never
    # equals the stored form, but the server sees no change and makes no revision.
    edit(
        folder / "judge.yaml", "connection: local", "connection: local\n  few_shot: [{expected: 1}]"
    )
    evalsite(remote, "push", folder, "judge")
    assert Evaluator.objects.get(slug="judge").head.parameters["few_shot"][0]["note"] == ""

    assert evalsite(remote, "push", folder, "judge") == 0

    assert versions() == {"judge": 1}
    out = capsys.readouterr().out
    assert "unchanged judge (the server found no change; the file differs only in form" in out
    evalsite(remote, "pull", folder, "judge")
    assert evalsite(remote, "diff", folder, "judge") == 0
