"""Online rules that target sessions (docs/online.md, "Session rules"): a session is judged as a
whole once nothing of it arrived for the rule's idle time, once per idle period (however many
sweeps, threads or hosts), again after it resumes; sampled by session id, filtered like trace
rules; backfill, pause, API and pages. A Python evaluator with ``evaluate_session`` judges, in
the real sandbox; the last test runs it all on real Celery workers with their beat.

Time passing is simulated by moving what the server stamped (the sessions' arrival times, the
rule's creation and watermark) into the past: no test waits for an idle time."""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from evalsite.errors import InvalidInput
from evaluators.services import evaluator_create
from runs.admin import OnlineRuleAdminForm
from runs.models import (
    Annotation,
    OnlineRule,
    Result,
    Scenario,
    Session,
    SessionRuleState,
    Trace,
)
from runs.online import (
    online_backfill,
    online_dispatch,
    online_evaluate_sessions,
    online_rule_create,
    online_rule_pause,
    online_rule_resume,
    online_rule_update,
    online_sampled,
    session_rule_sweep,
)
from runs.online.sessions import MARGIN
from runs.traces import trace_ingest
from tests.workers import wait_for

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
HOUR = 3600

JUDGE = """
def evaluate(inputs, outputs, trace):
    return True

def evaluate_session(inputs, outputs, session):
    users = [m["content"] for m in session["messages"] if m["role"] == "user"]
    return {
        "turns": len(session["traces"]),
        "first": inputs.get("message"),
        "last": outputs,
        "session": session["session_id"],
        "users": len(users),
    }
"""


@pytest.fixture
def judge(project):
    """A Python evaluator that judges sessions (counts the turns it was given)."""
    return evaluator_create(
        project=project,
        kind="code",
        name="Conversation",
        parameters={"runtime": "python", "code": JUDGE, "version": "2"},
    ).head


def session_rule(project, revision, **options):
    return online_rule_create(
        project=project,
        name=options.pop("name", "Conversations"),
        revision=revision,
        target="session",
        idle_seconds=options.pop("idle_seconds", HOUR),
        **options,
    )


def turn(session_id: str, number: int, *, env: str = "prod") -> dict:
    begin = T0 + timedelta(minutes=number)
    return {
        "trace_id": f"{session_id}-turn-{number}",
        "span_id": "root",
        "name": "support_agent",
        "kind": "agent",
        "start_time": begin.isoformat(),
        "end_time": (begin + timedelta(seconds=2)).isoformat(),
        "attributes": {
            "session.id": session_id,
            "ag": {
                "data": {
                    "inputs": {"message": f"question {number}"},
                    "outputs": f"answer {number}",
                },
                "meta": {"env": env},
            },
        },
    }


def converse(project, session_id: str, turns=range(1, 6), **options) -> None:
    trace_ingest(project=project, spans=[turn(session_id, n, **options) for n in turns])


def time_passes(seconds: float = 2 * HOUR) -> None:
    """Everything the server stamped happened ``seconds`` earlier: the sessions' last arrivals,
    the rules' creation and watermarks."""
    ago = timedelta(seconds=seconds)
    Session.objects.update(updated_at=F("updated_at") - ago)
    OnlineRule.objects.update(created_at=F("created_at") - ago)
    OnlineRule.objects.exclude(sessions_swept_until=None).update(
        sessions_swept_until=F("sessions_swept_until") - ago
    )


def judged(rule) -> list[str]:
    return list(
        Scenario.objects.filter(run=rule.run)
        .order_by("index")
        .values_list("session__session_id", flat=True)
    )


# --- once per idle period ---------------------------------------------------------------------


def test_a_session_is_judged_once_it_has_been_idle_and_only_once(project, judge):
    rule = session_rule(project, judge)
    converse(project, "chat-1")
    assert Session.objects.get(session_id="chat-1").trace_count == 5

    assert session_rule_sweep(rule_id=rule.pk) == 0  # still talking (it arrived just now)
    assert judged(rule) == []

    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert session_rule_sweep(rule_id=rule.pk) == 0  # the same idle period: never twice
    assert judged(rule) == ["chat-1"]

    scenario = Scenario.objects.select_related("trace", "session").get(run=rule.run)
    assert scenario.trace.trace_id == "chat-1-turn-5"  # the last turn
    assert scenario.inputs == {"message": "question 1"}  # the first turn's root inputs
    state = SessionRuleState.objects.get(rule=rule)
    assert (state.session_id, state.evaluated_traces, state.scenario_id) == (
        scenario.session_id,
        5,
        scenario.pk,
    )


def test_the_evaluation_is_stored_on_the_scenario_and_annotates_the_last_turn(project, judge):
    rule = session_rule(project, judge)
    converse(project, "chat-1")
    time_passes()

    assert online_evaluate_sessions(rule=rule) == 1  # one annotation cell written

    scenario = Scenario.objects.get(run=rule.run)
    assert scenario.status == "success"
    cell = Result.objects.select_related("annotation__trace").get(
        scenario=scenario, step_key__startswith="evaluator-"
    )
    assert cell.status == "success", cell.error
    assert cell.annotation.outputs == {
        "turns": 5,
        "first": "question 1",
        "last": "answer 5",
        "session": "chat-1",
        "users": 5,
    }
    assert cell.annotation.trace.trace_id == "chat-1-turn-5"
    rule.run.refresh_from_db()
    assert (rule.run.scenario_count, rule.run.error_cells) == (1, 0)


def test_a_session_that_resumes_is_judged_again_once_idle_again(project, judge):
    rule = session_rule(project, judge)
    converse(project, "chat-1")
    time_passes()
    online_evaluate_sessions(rule=rule)

    converse(project, "chat-1", turns=[6])  # the user comes back
    assert session_rule_sweep(rule_id=rule.pk) == 0  # talking again: not idle
    time_passes()
    assert online_evaluate_sessions(rule=rule) == 1
    assert session_rule_sweep(rule_id=rule.pk) == 0

    first, second = Scenario.objects.filter(run=rule.run).select_related("trace").order_by("index")
    assert (first.trace.trace_id, second.trace.trace_id) == ("chat-1-turn-5", "chat-1-turn-6")
    cells = Result.objects.filter(scenario__in=[first, second], step_key__startswith="evaluator-")
    turns = [cell.annotation.outputs["turns"] for cell in cells.order_by("scenario__index")]
    assert turns == [5, 6]  # each judgement saw the session as it was then


def test_spans_that_keep_arriving_keep_a_session_from_being_idle(project, judge):
    """Idle is measured by arrival (the server's clock), not by the turns' own timestamps: a
    conversation from last week sent now is judged once it has all arrived."""
    rule = session_rule(project, judge)
    converse(project, "replayed", turns=[1, 2])
    time_passes(HOUR / 2)
    converse(project, "replayed", turns=[3])  # its turns are old, its arrival is not
    time_passes(HOUR / 2 + 60)
    assert session_rule_sweep(rule_id=rule.pk) == 0  # the third turn arrived half an hour ago
    time_passes(HOUR / 2)
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert SessionRuleState.objects.get(rule=rule).evaluated_traces == 3


def test_a_session_that_went_idle_before_the_rule_existed_waits_for_a_backfill(
    project, judge, celery_eager, django_capture_on_commit_callbacks
):
    converse(project, "old-chat")
    time_passes(3 * HOUR)
    rule = session_rule(project, judge)
    converse(project, "new-chat")
    time_passes()

    assert online_evaluate_sessions(rule=rule) == 1  # one cell: new-chat's judgement
    assert judged(rule) == ["new-chat"]

    with django_capture_on_commit_callbacks(execute=True):  # its chunks run inline
        progress = online_backfill(rule=rule, since=T0 - timedelta(days=1))
    assert (progress["total"], progress["queued"]) == (2, 1)  # new-chat is done already
    assert sorted(judged(rule)) == ["new-chat", "old-chat"]
    with django_capture_on_commit_callbacks(execute=True):
        again = online_backfill(rule=rule, since=T0 - timedelta(days=1))
    assert again["queued"] == 0 and len(judged(rule)) == 2  # repeating it is free
    assert again["evaluated"] == 2 and again["finished"]


def test_a_sweep_judges_a_bounded_number_and_leaves_the_rest_for_the_next(project, judge):
    rule = session_rule(project, judge)
    for number in range(5):
        converse(project, f"chat-{number}", turns=[1])
    time_passes()
    assert [session_rule_sweep(rule_id=rule.pk, limit=2) for _ in range(4)] == [2, 2, 1, 0]
    assert sorted(judged(rule)) == [f"chat-{n}" for n in range(5)]


def test_an_ingest_that_committed_late_is_still_judged(project, judge):
    """An ingest stamps the session when its transaction begins; one that commits after a sweep
    moved the watermark past that stamp is looked at again (within the margin)."""
    rule = session_rule(project, judge)
    converse(project, "early", turns=[1])
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 1
    watermark = OnlineRule.objects.get(pk=rule.pk).sessions_swept_until
    converse(project, "late", turns=[1])
    Session.objects.filter(session_id="late").update(
        updated_at=watermark - MARGIN + timedelta(seconds=30)
    )
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert judged(rule) == ["early", "late"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_sweeps_judge_each_session_once(project, judge):
    rule = session_rule(project, judge)
    names = [f"chat-{n}" for n in range(12)]
    for name in names:
        converse(project, name, turns=[1, 2])
    time_passes()
    start = threading.Barrier(3)
    counts: list[int] = []
    failures: list[BaseException] = []

    def sweep() -> None:
        try:
            start.wait()
            for _ in range(3):
                counts.append(session_rule_sweep(rule_id=rule.pk, limit=5))
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert sum(counts) == len(names)
    assert sorted(judged(rule)) == sorted(names)  # each exactly once
    assert SessionRuleState.objects.filter(rule=rule).count() == len(names)


# --- which sessions ---------------------------------------------------------------------------


def test_sessions_are_sampled_by_session_id(project, judge):
    rule = session_rule(project, judge, sampling_rate=0.5)
    names = [f"user-{n}" for n in range(24)]
    for name in names:
        converse(project, name, turns=[1])
    time_passes()
    session_rule_sweep(rule_id=rule.pk)
    expected = {name for name in names if online_sampled(name, 0.5)}
    assert 0 < len(expected) < len(names)  # the test means something
    assert set(judged(rule)) == expected


def test_a_tiny_sample_judges_none_of_these_sessions(project, judge):
    names = [f"user-{n}" for n in range(10)]
    assert not any(online_sampled(name, 1e-6) for name in names)
    rule = session_rule(project, judge, sampling_rate=1e-6)
    for name in names:
        converse(project, name, turns=[1])
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 0
    assert judged(rule) == [] and not SessionRuleState.objects.exists()


def test_a_rate_of_zero_is_refused(project, judge):
    with pytest.raises(InvalidInput) as refused:
        session_rule(project, judge, sampling_rate=0)
    assert "sampling_rate" in refused.value.fields
    assert not OnlineRule.objects.exists()


def test_a_session_matches_when_any_of_its_traces_matches_the_filter(project, judge):
    rule = session_rule(project, judge, filter={"attributes": {"ag.meta.env": "prod"}})
    converse(project, "staging-only", env="staging")
    converse(project, "staging-then-prod", turns=[1, 2], env="staging")
    converse(project, "staging-then-prod", turns=[3], env="prod")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert judged(rule) == ["staging-then-prod"]
    # The judged session is the whole conversation, not only its matching turns.
    assert SessionRuleState.objects.get(rule=rule).evaluated_traces == 3


def test_a_filter_no_session_matches_judges_nothing(project, judge):
    rule = session_rule(project, judge, filter={"name": "checkout"})
    converse(project, "chat-1")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 0
    assert judged(rule) == []


def test_traces_without_a_session_and_trace_rules_are_left_alone(project, judge):
    """A session rule never takes single traces as they arrive; a trace rule never sweeps."""
    rule = session_rule(project, judge)
    trace_rule = online_rule_create(project=project, name="Each turn", revision=judge)
    converse(project, "chat-1")
    ids = list(Trace.objects.values_list("pk", flat=True))
    assert online_dispatch(project_id=project.pk, trace_ids=ids) == 5  # the trace rule's
    time_passes()
    assert session_rule_sweep(rule_id=trace_rule.pk) == 0
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert Scenario.objects.filter(run=rule.run).count() == 1


def test_a_paused_rule_judges_nothing_and_catches_up_when_resumed(project, judge):
    rule = session_rule(project, judge)
    online_rule_pause(rule=rule, reason="judge outage")
    converse(project, "chat-1")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 0
    online_rule_resume(rule=rule)
    assert session_rule_sweep(rule_id=rule.pk) == 1


def test_a_longer_idle_time_applies_from_now_on(project, judge):
    rule = session_rule(project, judge)
    online_rule_update(rule=rule, idle_seconds=3 * HOUR)
    converse(project, "chat-1")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 0  # 2 h of quiet is not 3
    time_passes(HOUR + 60)
    assert session_rule_sweep(rule_id=rule.pk) == 1


def test_a_new_rules_first_window_is_on_the_database_clock(project, judge):
    """Sessions are stamped by the database: an app server whose clock runs ahead must not make
    a new rule skip the sessions that go idle after it was made."""
    rule = session_rule(project, judge)
    OnlineRule.objects.filter(pk=rule.pk).update(
        created_at=F("created_at") + 3 * timedelta(hours=1)
    )
    converse(project, "chat-1")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert judged(rule) == ["chat-1"]


def test_a_sweep_reads_only_the_first_turns_root_inputs(project, judge):
    """Claiming runs under the live run's lock: it reads the first turn's root inputs out of the
    attributes in PostgreSQL, never the turn's other spans or whole attributes."""
    rule = session_rule(project, judge)
    steps = [
        {**turn("big", 1), "span_id": f"step-{n}", "parent_id": "root", "name": "step"}
        for n in range(50)
    ]
    trace_ingest(project=project, spans=[turn("big", 1), *steps, turn("big", 2)])
    time_passes()
    with CaptureQueriesContext(connection) as queries:
        assert session_rule_sweep(rule_id=rule.pk) == 1
    reads = [q["sql"] for q in queries.captured_queries]
    spans = [sql for sql in reads if sql.startswith('SELECT "runs_span"')]
    assert spans and all(""""runs_span"."parent_id" = ''""" in sql for sql in spans)
    assert not any('"runs_span"."attributes",' in sql for sql in reads), spans
    assert Scenario.objects.get(run=rule.run).inputs == {"message": "question 1"}


def test_a_session_too_large_to_judge_is_an_error_found_before_loading_it(project, judge, settings):
    rule = session_rule(project, judge)
    noise = " ".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(100))
    spans = [turn("huge", n) for n in (1, 2)]
    for span in spans:
        span["attributes"]["ag"]["data"]["internals"] = {"context": noise}  # ~6.5 KB each
    trace_ingest(project=project, spans=spans)
    converse(project, "small", turns=[1])
    time_passes()
    settings.EVALSITE_MAX_BODY_BYTES = 10_000
    with CaptureQueriesContext(connection) as queries:
        assert online_evaluate_sessions(rule=rule) == 2
    loads = [q for q in queries.captured_queries if q["sql"].startswith('SELECT "runs_span"."id"')]
    assert len(loads) == 1  # the small session's spans; never the huge one's
    cells = Result.objects.filter(scenario__run=rule.run, step_key__startswith="evaluator-")
    huge = cells.get(scenario__session__session_id="huge")
    assert (huge.status, huge.error["code"], huge.annotation) == (
        "error",
        "session_too_large",
        None,
    )
    assert "EVALSITE_MAX_BODY_BYTES" in huge.error["message"]
    small = cells.get(scenario__session__session_id="small")
    assert small.status == "success" and small.annotation.outputs["turns"] == 1


def test_a_session_whose_judged_turn_was_deleted_is_judged_as_it_was_claimed(project, judge):
    """Retention may delete the judged last turn before a worker gets to it: the session is
    still cut where it stood when claimed, not judged with the turns that came after."""
    rule = session_rule(project, judge)
    converse(project, "chat-1")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 1  # claimed: five turns
    converse(project, "chat-1", turns=[6])  # the user comes back before the worker runs
    Trace.objects.filter(trace_id="chat-1-turn-5").delete()
    assert online_evaluate_sessions(rule=rule) == 1
    cell = Result.objects.get(scenario__run=rule.run, step_key__startswith="evaluator-")
    assert cell.status == "success", cell.error
    assert cell.annotation.outputs["turns"] == 4  # turns 1-4; not turn 6


# --- refusals -----------------------------------------------------------------------------------


def test_a_session_rule_needs_an_evaluator_that_judges_sessions(project):
    regex = evaluator_create(
        project=project, kind="regex", name="Says hi", parameters={"pattern": "hi"}
    )
    with pytest.raises(InvalidInput) as refused:
        session_rule(project, regex.head)
    assert set(refused.value.fields) == {"revision"}
    assert not OnlineRule.objects.exists()


@pytest.mark.parametrize("idle", [0, 9, 7 * 86400 + 1, "soon"])
def test_the_idle_time_is_bounded(project, judge, idle):
    with pytest.raises(InvalidInput) as refused:
        session_rule(project, judge, idle_seconds=idle)
    assert "idle_seconds" in refused.value.fields
    assert not OnlineRule.objects.exists()


def test_the_admin_refuses_an_idle_time_out_of_bounds(project, judge):
    rule = session_rule(project, judge)
    for idle in (0, 9, 7 * 86400 + 1):
        form = OnlineRuleAdminForm(data={"revision": judge.pk, "idle_seconds": idle}, instance=rule)
        assert not form.is_valid() and "idle_seconds" in form.errors, idle
    form = OnlineRuleAdminForm(data={"revision": judge.pk, "idle_seconds": 60}, instance=rule)
    assert form.is_valid(), form.errors
    assert OnlineRule.objects.get(pk=rule.pk).idle_seconds == HOUR  # nothing saved by checking


# --- API ------------------------------------------------------------------------------------------


def test_the_api_creates_and_changes_a_session_rule(api, judge):
    body = {"name": "Chats", "evaluator": "conversation", "target": "session", "idle_seconds": 600}
    created = api.post("/api/v1/online-rules", body, format="json")
    assert created.status_code == 201, created.json()
    rule = created.json()
    assert (rule["target"], rule["idle_seconds"]) == ("session", 600)
    url = f"/api/v1/online-rules/{rule['id']}"
    changed = api.patch(url, {"idle_seconds": 1800}, format="json")
    assert changed.status_code == 200 and changed.json()["idle_seconds"] == 1800
    refused = api.patch(url, {"idle_seconds": 5}, format="json")
    assert refused.status_code == 400 and "idle_seconds" in refused.json()["error"]["fields"]
    assert OnlineRule.objects.get().idle_seconds == 1800


def test_the_api_refuses_a_session_rule_whose_evaluator_judges_traces_only(api, project):
    evaluator_create(project=project, kind="regex", name="Says hi", parameters={"pattern": "hi"})
    response = api.post(
        "/api/v1/online-rules",
        {"name": "Chats", "evaluator": "says-hi", "target": "session"},
        format="json",
    )
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["revision"]
    assert not OnlineRule.objects.exists()


def test_viewers_cannot_create_session_rules(viewer_api, judge):
    body = {"name": "Chats", "evaluator": "conversation", "target": "session"}
    assert viewer_api.post("/api/v1/online-rules", body, format="json").status_code == 403
    assert not OnlineRule.objects.exists()


# --- pages ------------------------------------------------------------------------------------


def test_the_form_creates_a_session_rule(editor_client, project, judge):
    page = editor_client.get("/p/acme/online/new").content.decode()
    assert 'name="target"' in page and 'name="idle_seconds"' in page
    response = editor_client.post(
        "/p/acme/online/new",
        {
            "name": "Chats",
            "evaluator": judge.evaluator_id,
            "target": "session",
            "idle_seconds": 600,
            "sampling_percent": 100,
            "bucket_seconds": 3600,
        },
    )
    assert response.status_code == 302
    rule = OnlineRule.objects.get()
    assert (rule.target, rule.idle_seconds) == ("session", 600)


def test_the_form_shows_why_an_evaluator_cannot_judge_sessions(editor_client, project):
    regex = evaluator_create(
        project=project, kind="regex", name="Says hi", parameters={"pattern": "hi"}
    )
    response = editor_client.post(
        "/p/acme/online/new",
        {
            "name": "Chats",
            "evaluator": regex.pk,
            "target": "session",
            "idle_seconds": 600,
            "sampling_percent": 100,
            "bucket_seconds": 3600,
        },
    )
    assert response.status_code == 400
    assert response.context["form"].errors["evaluator"]
    assert not OnlineRule.objects.exists()


def test_the_rule_page_lists_judged_sessions(viewer_client, project, judge):
    rule = session_rule(project, judge)
    converse(project, "chat-1")
    multiline = turn("chat-2", 1)
    multiline["attributes"]["session.id"] = "line 1\nline 2"  # no URL path can hold it
    trace_ingest(project=project, spans=[multiline])
    time_passes()
    online_evaluate_sessions(rule=rule)
    page = viewer_client.get(f"/p/acme/online/{rule.pk}/").content.decode()
    assert "once it has been idle for 3600 s" in page and "% by session id" in page
    for session in Session.objects.all():  # the sessions' pages, by pk
        assert f'href="/p/acme/sessions/{session.pk}/"' in page
    assert "/p/acme/traces/chat-1-turn-5" in page  # and its last turn's
    changed = viewer_client.post(f"/p/acme/online/{rule.pk}/edit", {"idle_seconds": 60})
    assert changed.status_code == 403  # viewers read, never change
    assert OnlineRule.objects.get(pk=rule.pk).idle_seconds == HOUR


def test_the_edit_form_changes_the_idle_time_but_not_the_target(editor_client, project, judge):
    rule = session_rule(project, judge)
    page = editor_client.get(f"/p/acme/online/{rule.pk}/edit").content.decode()
    assert 'name="idle_seconds"' in page and 'name="target"' not in page
    response = editor_client.post(
        f"/p/acme/online/{rule.pk}/edit",
        {
            "name": "Conversations",
            "target": "trace",  # ignored: fixed for the rule's life
            "idle_seconds": 120,
            "sampling_percent": 100,
            "bucket_seconds": 3600,
        },
    )
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.target, rule.idle_seconds) == ("session", 120)


# --- on real workers ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_workers_judge_an_idle_session_from_their_beat(project, api, judge, workers):
    workers.env["EVALSITE_SESSION_SWEEP_SECONDS"] = "1"
    rule = session_rule(project, judge)
    spans = [turn("live-chat", n) for n in range(1, 6)]
    assert api.post("/api/v1/traces", {"spans": spans}, format="json").status_code == 200
    workers.start()
    time_passes()  # the conversation ended two hours ago
    wait_for(lambda: Annotation.objects.exists(), 90, "the beat's sweep and a worker to judge")
    wait_for(
        lambda: Scenario.objects.get(run=rule.run).status == "success", 30, "the scenario's status"
    )
    annotation = Annotation.objects.select_related("trace").get()
    assert annotation.outputs["turns"] == 5 and annotation.trace.trace_id == "live-chat-turn-5"
    # Sweeps go on every second; the session is judged once.
    SessionRuleState.objects.get(rule=rule)
    sweeps = _log_count(workers, "ingest_sessions_sweep", "succeeded")
    wait_for(
        lambda: _log_count(workers, "ingest_sessions_sweep", "succeeded") >= sweeps + 3,
        30,
        "three more sweeps",
    )
    assert Scenario.objects.filter(run=rule.run).count() == 1
    assert Annotation.objects.count() == 1


def _log_count(workers, *words: str) -> int:
    log = (workers.tmp_path / "worker-0.log").read_text(errors="replace")
    return sum(1 for line in log.splitlines() if all(word in line for word in words))
