"""The outbound HTTP boundary (evalsite/outbound.py): which addresses a call may reach, that the
connection goes where the check looked, redirect hops, size and time bounds, Retry-After.

Names resolve through a stub resolver, so no test's traffic leaves the machine: refusals happen
before any connection, and real requests go to servers on 127.0.0.1 (a test policy counts the
server's own address and port as public where a test needs a "public" address that answers).
"""

from __future__ import annotations

import email.utils
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import openai
import pytest

from evalsite import outbound
from evaluators.judge.client import Caller, Shared, model_http_client
from evaluators.normalize import EvaluationError
from evaluators.services import evaluation_invoke
from runs.applications import application_create, invoke_many
from tests.llm_server import completion
from tests.servers import Reply

PUBLIC = "93.184.215.14"


class Answers:
    """A resolver answering from a table: one list of addresses per lookup, the last repeating."""

    def __init__(self, **table: list[list[str]]) -> None:
        self.table = {host.replace("_", "."): list(answers) for host, answers in table.items()}
        self.lookups: list[str] = []

    def resolve(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        answers = self.table.get(host)
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, "not in the test's table")
        return answers.pop(0) if len(answers) > 1 else answers[0]


@dataclass(frozen=True)
class OnlyThese(outbound.Policy):
    """Counts the listed (address, port) pairs as public and judges every other address as
    production does, so a local server can stand in for a public one."""

    public: frozenset = frozenset()

    def refuses(self, address: str, port: int) -> str | None:
        return None if (address, port) in self.public else super().refuses(address, port)


def policy(resolver=None, *, public=(), allow_private=False) -> outbound.Policy:
    return OnlyThese(
        allow_private=allow_private,
        setting="EVALSITE_TEST_ALLOW_PRIVATE",
        caller="Tests",
        resolver=resolver,
        public=frozenset(public),
    )


def get(checked: outbound.Policy, url: str, *, timeout: float = 2, **options):
    with outbound.client(checked, timeout=timeout, **options) as client:
        return client.get(url)


@pytest.fixture
def stub_resolver(monkeypatch):
    """The module-wide resolver, for call sites that build their own policy (webhooks, ...)."""
    stub = Answers()
    monkeypatch.setattr(outbound, "resolver", stub)
    return stub


INWARD = [
    ("127.0.0.1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "shared"),
    ("169.254.169.254", "link-local"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fd00::1", "private"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::127.0.0.1", "loopback"),  # IPv4-compatible
    ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of the metadata service
    ("64:ff9b:1::a00:1", "reserved"),  # local-use NAT64
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
]


@pytest.mark.parametrize(("address", "reason"), INWARD)
def test_it_names_why_each_spelling_of_an_inward_address_is_not_public(address, reason):
    assert outbound.why_not_global(address) == reason


@pytest.mark.parametrize(("address", "reason"), INWARD)
def test_it_refuses_a_request_to_each_spelling_before_connecting(address, reason):
    resolver = Answers(inward_test=[[address]])
    with pytest.raises(outbound.Refused) as refused:
        get(policy(resolver), "http://inward.test:8080/latest/meta-data/")
    assert (refused.value.host, refused.value.address, refused.value.reason) == (
        "inward.test",
        address,
        reason,
    )
    message = str(refused.value)
    assert f"'inward.test' resolves to {address}" in message
    assert "EVALSITE_TEST_ALLOW_PRIVATE=1" in message


def test_it_names_the_ipv4_address_inside_a_wrapped_one():
    resolver = Answers(nat64_test=[["64:ff9b::a9fe:a9fe"]])
    with pytest.raises(outbound.Refused) as refused:
        outbound.checked_addresses("http://nat64.test/", policy(resolver))
    assert "64:ff9b::a9fe:a9fe (IPv4 169.254.169.254), a link-local address" in str(refused.value)


def test_it_refuses_an_ip_literal_without_looking_it_up():
    resolver = Answers()
    with pytest.raises(outbound.Refused):
        outbound.checked_addresses("http://[::ffff:169.254.169.254]/", policy(resolver))
    assert resolver.lookups == []


@pytest.mark.parametrize(
    "address", [PUBLIC, "8.8.8.8", "2606:4700::1111", "2002:5db8:d70e::", "64:ff9b::808:808"]
)
def test_it_lets_public_addresses_and_their_wrapped_spellings_through(address):
    assert outbound.why_not_global(address) is None
    resolver = Answers(public_test=[[address]])
    assert outbound.checked_addresses("https://public.test/", policy(resolver)) == [address]


def test_it_refuses_a_name_when_any_of_its_addresses_is_inward():
    resolver = Answers(mixed_test=[[PUBLIC, "127.0.0.1"]])
    with pytest.raises(outbound.Refused) as refused:
        outbound.checked_addresses("http://mixed.test/", policy(resolver))
    assert refused.value.address == "127.0.0.1"


def test_allow_private_lets_inward_addresses_through():
    resolver = Answers(inward_test=[["10.0.0.5"]])
    allowing = policy(resolver, allow_private=True)
    assert outbound.checked_addresses("http://inward.test/", allowing) == ["10.0.0.5"]


def test_a_name_that_does_not_resolve_is_unresolvable():
    with pytest.raises(outbound.Unresolvable, match=r"'nowhere\.test' could not be resolved"):
        outbound.checked_addresses("http://nowhere.test/", policy(Answers()))


@pytest.fixture
def trap():
    """A listener on 127.0.0.2, on a port the test chooses to match; it records connections."""
    listeners = []

    def listen(port: int) -> socket.socket:
        listener = socket.create_server(("127.0.0.2", port))
        listener.setblocking(False)
        listeners.append(listener)
        return listener

    yield listen
    for listener in listeners:
        listener.close()


def connected(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_dns_rebinding_cannot_move_the_connection_off_the_checked_address(http_server, trap):
    # The name first answers the server's address (public for this policy), then rebinds to
    # another loopback address where a listener waits. The request goes where the check looked,
    # with the name kept in Host; a request made after the rebinding is refused.
    http_server.handler = lambda request: Reply(200, {"ok": True})
    listener = trap(http_server.port)
    resolver = Answers(rebind_test=[["127.0.0.1"], ["127.0.0.2"]])
    checked = policy(resolver, public={("127.0.0.1", http_server.port)})
    url = f"http://rebind.test:{http_server.port}/hook"
    with outbound.client(checked, timeout=2) as client:
        assert client.get(url).json() == {"ok": True}
        assert resolver.lookups == ["rebind.test"]  # once, by the check; never by the connector
        with pytest.raises(outbound.Refused) as refused:
            client.get(url)
    assert refused.value.address == "127.0.0.2" and refused.value.reason == "loopback"
    assert [r.headers["Host"] for r in http_server.requests] == [f"rebind.test:{http_server.port}"]
    assert not connected(listener)


def test_a_webhook_refuses_a_name_that_resolves_to_the_metadata_service(stub_resolver):
    stub_resolver.table["hooks.test"] = [["169.254.169.254"]]
    result = evaluation_invoke(
        kind="webhook",
        parameters={"url": "http://hooks.test/grade", "timeout_seconds": 1},
        inputs={},
        outputs="x",
    )
    assert result.error["code"] == "webhook_address_refused"
    assert "169.254.169.254, a link-local address" in result.error["message"]
    assert "EVALSITE_WEBHOOK_ALLOW_PRIVATE=1" in result.error["message"]


def _redirect_to(target: str) -> Reply:
    return Reply(307, b"", headers={"Location": target})


def _model_client(base_url: str, checked: outbound.Policy) -> openai.OpenAI:
    """The openai client as evaluators.judge.client builds it, with the test's policy."""
    return openai.OpenAI(
        base_url=base_url,
        api_key="sk-test",
        max_retries=0,
        timeout=5,
        http_client=model_http_client(checked, 5),
    )


def _chat(client: openai.OpenAI):
    return client.chat.completions.create(
        model="judge-1", messages=[{"role": "user", "content": "hi"}]
    )


def test_a_model_redirect_to_an_address_the_policy_refuses_is_not_followed(llm_server, http_server):
    # The first hop is allowed (the model server's own address and port); the redirect target,
    # another port on loopback, is refused by the same policy: the transport checks every hop.
    llm_server.answer = _redirect_to(f"http://127.0.0.1:{http_server.port}/v1/chat/completions")
    checked = policy(public={("127.0.0.1", llm_server.server.port)})
    with pytest.raises(openai.APIConnectionError) as failed:
        _chat(_model_client(llm_server.url, checked))
    cause = failed.value.__cause__
    assert isinstance(cause, outbound.Refused)
    assert (cause.address, cause.reason) == ("127.0.0.1", "loopback")
    assert len(llm_server.calls) == 1
    assert http_server.requests == []


def test_a_model_redirect_to_an_allowed_address_is_followed(llm_server, http_server):
    llm_server.answer = _redirect_to(f"http://127.0.0.1:{http_server.port}/v1/chat/completions")
    http_server.handler = lambda request: completion("moved")
    checked = policy(
        public={("127.0.0.1", llm_server.server.port), ("127.0.0.1", http_server.port)}
    )
    reply = _chat(_model_client(llm_server.url, checked))
    assert reply.choices[0].message.content == "moved"
    assert len(http_server.requests) == 1


def test_a_judge_call_fails_at_once_when_a_redirect_is_refused(
    llm_connection, llm_server, http_server
):
    llm_server.answer = _redirect_to(f"http://127.0.0.1:{http_server.port}/v1/chat/completions")
    shared = Shared(llm_connection, spend_scope="test", max_cost_usd=None)
    shared.client = _model_client(
        llm_server.url, policy(public={("127.0.0.1", llm_server.server.port)})
    )
    caller = Caller(shared, model="judge-1", max_retries=3)
    with pytest.raises(EvaluationError) as failed:
        caller.chat([{"role": "user", "content": "hi"}])
    assert failed.value.code == "connection_address_refused"
    assert len(caller.usage.attempts) == 1  # a refusal is not retried
    assert http_server.requests == []


def test_a_judge_call_is_checked_when_sent_not_only_when_saved(
    llm_connection, llm_server, settings
):
    # Saved while private addresses were allowed; the setting is off when the call is made.
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = False
    caller = Caller(
        Shared(llm_connection, spend_scope="test", max_cost_usd=None),
        model="judge-1",
        max_retries=2,
    )
    with pytest.raises(EvaluationError) as failed:
        caller.chat([{"role": "user", "content": "hi"}])
    assert failed.value.code == "connection_address_refused"
    assert "EVALSITE_MODELS_ALLOW_PRIVATE=1" in failed.value.message
    assert llm_server.calls == []


def _local(port: int) -> outbound.Policy:
    return policy(public={("127.0.0.1", port)})


def test_it_refuses_an_answer_declared_larger_than_the_bound(http_server):
    http_server.handler = lambda request: Reply(200, "x" * 5000)
    with pytest.raises(outbound.TooLarge, match="larger than 1000 bytes"):
        get(_local(http_server.port), http_server.url, max_response_bytes=1000)


@pytest.fixture
def chunked_server():
    """Answers with a chunked body (no Content-Length) of ``size`` bytes, one 1 KiB chunk every
    ``every`` seconds; ``size`` None never ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    plan = {"size": 64 * 1024, "every": 0.0}

    def serve():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            sent, chunk = 0, b"x" * 1024
            try:
                while not stop.is_set() and (plan["size"] is None or sent < plan["size"]):
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
                    stop.wait(plan["every"])
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the client stopped reading, as it should

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], plan
    stop.set()
    listener.close()


def test_it_stops_reading_an_undeclared_answer_at_the_bound(chunked_server):
    port, _ = chunked_server
    with pytest.raises(outbound.TooLarge):
        get(_local(port), f"http://127.0.0.1:{port}/", timeout=5, max_response_bytes=10_000)


def test_it_bounds_the_total_time_of_a_slowly_dripping_answer(chunked_server):
    # Every chunk comes well within the read timeout, so only the total bound can end it.
    port, plan = chunked_server
    plan.update(size=None, every=0.1)
    started = time.monotonic()
    with pytest.raises(outbound.TooSlow):
        get(_local(port), f"http://127.0.0.1:{port}/", timeout=0.8)
    assert time.monotonic() - started < 2


def test_it_asks_for_and_accepts_only_uncompressed_answers(http_server):
    http_server.handler = lambda request: Reply(200, b"\x1f\x8b", {"Content-Encoding": "gzip"})
    with pytest.raises(outbound.Compressed, match="Content-Encoding gzip"):
        get(_local(http_server.port), http_server.url)
    assert http_server.requests[0].headers["Accept-Encoding"] == "identity"


def test_retry_after_reads_seconds_milliseconds_and_http_dates():
    soon = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=5), usegmt=True)
    past = email.utils.format_datetime(datetime.now(UTC) - timedelta(hours=1), usegmt=True)
    assert outbound.retry_after({"retry-after": "3"}) == 3.0
    assert outbound.retry_after({"retry-after-ms": "250", "retry-after": "3"}) == 0.25
    assert 3.5 < outbound.retry_after({"retry-after": soon}) <= 5.0
    assert outbound.retry_after({"retry-after": past}) == 0.0
    assert outbound.retry_after({"retry-after": "soon"}) is None
    assert outbound.retry_after({}) is None


def test_backoff_prefers_the_servers_word_and_otherwise_grows_within_its_cap():
    backoff = outbound.Backoff(base_seconds=0.5, max_seconds=3.0)
    assert backoff.pause(1, {"retry-after": "7"}) == 7.0 and backoff.too_long(7.0)
    assert all(0 <= backoff.pause(1) <= 1.0 for _ in range(50))
    assert all(0 <= backoff.pause(10) <= 3.0 for _ in range(50))


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_an_application_retry_waits_as_long_as_retry_after_says(
    project, http_server, settings, form
):
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True
    wait = (
        "2"
        if form == "seconds"
        else email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    )
    arrivals, answers = (
        [],
        iter([Reply(503, "busy", {"Retry-After": wait}), Reply(200, {"outputs": "ok"})]),
    )

    def handler(request):
        arrivals.append(time.monotonic())
        return next(answers)

    http_server.handler = handler
    app = application_create(
        project=project, name="Bot", kind="http", config={"url": http_server.url, "retries": 1}
    )
    [invocation] = invoke_many(app, [{}])
    assert invocation.ok
    # An HTTP date has whole seconds: "2 s from now" is between 1 and 2 s away.
    assert arrivals[1] - arrivals[0] >= (1.9 if form == "seconds" else 0.9)


def test_an_application_gives_up_when_retry_after_is_longer_than_it_waits(
    project, http_server, settings
):
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True
    http_server.handler = lambda request: Reply(503, "maintenance", {"Retry-After": "3600"})
    app = application_create(
        project=project, name="Bot", kind="http", config={"url": http_server.url, "retries": 3}
    )
    [invocation] = invoke_many(app, [{}])
    assert invocation.error["code"] == "http_status"
    assert "asked to wait 3600 s" in invocation.error["message"]
    assert len(http_server.requests) == 1


def test_an_application_refused_address_is_not_retried(project, stub_resolver):
    stub_resolver.table["app.test"] = [["10.0.0.7"]]
    app = application_create(
        project=project, name="Bot", kind="http", config={"url": "http://app.test/", "retries": 3}
    )
    [invocation] = invoke_many(app, [{}])
    assert invocation.error["code"] == "address_refused"
    assert "10.0.0.7, a private address" in invocation.error["message"]
    assert "EVALSITE_APPLICATIONS_ALLOW_PRIVATE=1" in invocation.error["message"]
    assert stub_resolver.lookups == ["app.test"]
