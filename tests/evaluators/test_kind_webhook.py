import socket
import threading
import time

import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate
from tests.servers import Reply

INPUTS = {"country": "France", "correct_answer": "Paris"}


@pytest.fixture
def private_allowed(settings):
    settings.EVALSITE_WEBHOOK_ALLOW_PRIVATE = True


def run(url, outputs="Paris", trace=None, **parameters):
    return evaluation_invoke(
        kind="webhook",
        parameters={"url": url, **parameters},
        inputs=INPUTS,
        outputs=outputs,
        trace=trace,
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("webhook"), parameters)
    return caught.value.fields


def test_it_posts_the_evaluation_and_keeps_the_answer(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, {"score": 0.9, "success": True})
    trace = {"trace_id": "t1", "spans": {}}
    result = run(
        f"{http_server.url}/judge?team=qa",
        trace=trace,
        headers={"Authorization": "Bearer s3cret"},
        config={"strict": True},
    )
    assert result.status == "success"
    assert result.outputs == {"score": 0.9, "success": True}
    [request] = http_server.requests
    assert request.method == "POST"
    assert request.path == "/judge?team=qa"
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Host"] == f"127.0.0.1:{http_server.port}"
    body = request.json()
    assert body["inputs"] == INPUTS
    assert body["outputs"] == "Paris"
    assert body["trace"] == trace
    assert body["parameters"]["config"] == {"strict": True}
    assert "headers" not in body["parameters"]


def test_it_normalises_a_number_with_the_threshold(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, "0.7")
    assert run(http_server.url).outputs == {"score": 0.7, "success": True}
    assert run(http_server.url, threshold=0.8).outputs == {"score": 0.7, "success": False}


def test_it_normalises_a_boolean(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, "false")
    assert run(http_server.url).outputs == {"success": False}


def test_it_fails_when_the_answer_is_null(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, "null")
    result = run(http_server.url)
    assert result.status == "error"
    assert result.error["code"] == "invalid_return"


def test_it_fails_on_an_http_error_with_the_answer(http_server, private_allowed):
    http_server.handler = lambda request: Reply(503, "judge is down")
    result = run(http_server.url)
    assert result.status == "error"
    assert result.error["code"] == "webhook_http_error"
    assert "HTTP 503: judge is down" in result.error["message"]


def test_it_does_not_follow_redirects(http_server, private_allowed):
    http_server.handler = lambda request: Reply(302, headers={"Location": "/elsewhere"})
    result = run(f"{http_server.url}/judge")
    assert result.error["code"] == "webhook_http_error"
    assert "a redirect to /elsewhere" in result.error["message"]
    assert [r.path for r in http_server.requests] == ["/judge"]


def test_it_times_out(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, {"success": True}, delay=2)
    started = time.monotonic()
    result = run(http_server.url, timeout_seconds=0.3)
    assert result.error["code"] == "webhook_timeout"
    assert result.error["message"] == "The webhook did not answer within 0.3 seconds."
    assert time.monotonic() - started < 1.5


def test_it_refuses_a_declared_oversize_answer(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, {"comment": "x" * 5000})
    result = run(http_server.url, max_response_bytes=1000)
    assert result.error["code"] == "webhook_response_too_large"
    assert "(1000 bytes)" in result.error["message"]


@pytest.fixture
def endless_server():
    """Answers every request with a chunked body that never ends (no Content-Length)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b" " * 1024
            try:
                while not stop.is_set():
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                pass  # the client stopped reading, as it should

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


def test_it_stops_reading_an_endless_answer(endless_server, private_allowed):
    result = run(endless_server, max_response_bytes=10_000, timeout_seconds=5)
    assert result.status == "error"
    assert result.error["code"] == "webhook_response_too_large"


def test_it_fails_when_the_answer_is_not_json(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, "<html>OK</html>")
    result = run(http_server.url)
    assert result.error["code"] == "webhook_invalid_response"
    assert "'<html>OK</html>'" in result.error["message"]


def test_it_fails_when_nothing_listens(private_allowed):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    result = run(f"http://127.0.0.1:{port}/")
    assert result.error["code"] == "webhook_unreachable"


def test_it_tries_each_address_of_a_host(http_server, private_allowed):
    # localhost may resolve to ::1 first; the server listens on 127.0.0.1 only.
    http_server.handler = lambda request: Reply(200, "true")
    result = run(f"http://localhost:{http_server.port}/")
    assert result.outputs == {"success": True}
    assert http_server.requests[0].headers["Host"] == f"localhost:{http_server.port}"


def test_it_refuses_loopback_addresses_by_default(http_server):
    result = run(http_server.url)
    assert result.status == "error"
    assert result.error["code"] == "webhook_address_refused"
    assert "resolves to 127.0.0.1, a loopback address" in result.error["message"]
    assert http_server.requests == []


def test_it_refuses_a_name_that_resolves_to_loopback(http_server):
    result = run(f"http://localhost:{http_server.port}/")
    assert result.error["code"] == "webhook_address_refused"
    assert http_server.requests == []


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.1.2.3/", "private"),
        ("http://192.168.0.10:8080/", "private"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[fe80::1]/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://100.64.0.1/", "shared"),
        ("http://[::127.0.0.1]/", "loopback"),
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),
    ],
)
def test_it_refuses_private_and_link_local_addresses(url, what):
    result = run(url, timeout_seconds=1)
    assert result.error["code"] == "webhook_address_refused"
    assert f" {what} address" in result.error["message"]
    assert "EVALSITE_WEBHOOK_ALLOW_PRIVATE=1" in result.error["message"]


# Every spelling of an inward address, and public ones passing: tests/security/test_outbound.py


def test_it_fails_for_a_host_that_does_not_resolve():
    result = run("https://no-such-host.invalid/hook")
    assert result.error["code"] == "webhook_unresolvable"
    assert "'no-such-host.invalid'" in result.error["message"]


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "example.com/hook",
        "https://",
        "http://exa mple.com/",
        "http://a..b/",
        "http://example.com:99999/",
    ],
)
def test_it_refuses_urls_that_are_not_http(url):
    assert "parameters.url" in refused(url=url)


def test_it_refuses_credentials_in_the_url():
    fields = refused(url="https://user:pw@example.com/hook")
    assert fields == {"parameters.url": ["must not hold credentials; send them in headers instead"]}


def test_it_refuses_headers_it_sets_itself_and_broken_ones():
    assert refused(url="https://example.com", headers={"Host": "evil"}) == {
        "parameters.headers": ["Host is set by evalsite and cannot be changed"]
    }
    assert "parameters.headers" in refused(url="https://example.com", headers={"X-A": "1\r\nB: 2"})
    assert "parameters.headers" in refused(url="https://example.com", headers={"bad name": "1"})


def test_it_refuses_bad_limits():
    assert "parameters.timeout_seconds" in refused(url="https://example.com", timeout_seconds=0)
    assert "parameters.max_response_bytes" in refused(
        url="https://example.com", max_response_bytes=0
    )


def test_it_requires_a_url():
    assert refused() == {"parameters.url": ["Field required"]}


def test_it_asks_for_and_reads_only_uncompressed_answers(http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, b"\x1f\x8b", {"Content-Encoding": "gzip"})
    result = run(http_server.url)
    assert http_server.requests[0].headers["Accept-Encoding"] == "identity"
    assert result.error["code"] == "webhook_invalid_response"
    assert "Content-Encoding gzip" in result.error["message"]
