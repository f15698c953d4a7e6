"""Real HTTP servers on 127.0.0.1 for tests of outbound calls (webhooks, endpoints, LLMs).

A test describes what the server answers with a handler function; the fixture records every
request it received, so tests assert on what evalsite actually sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | dict | list = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Handler = Callable[[Received], Reply]


class LocalServer:
    def __init__(self):
        self.requests: list[Received] = []
        self.handler: Handler = lambda request: Reply(200, {})
        server = self

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                received = Received(
                    self.command, self.path, dict(self.headers), self.rfile.read(length)
                )
                server.requests.append(received)
                reply = server.handler(received)
                if reply.delay:
                    threading.Event().wait(reply.delay)
                body = reply.body
                if isinstance(body, dict | list):
                    body = json.dumps(body).encode()
                    reply.headers.setdefault("Content-Type", "application/json")
                elif isinstance(body, str):
                    body = body.encode()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing to tell it

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def http_server():
    server = LocalServer()
    yield server
    server.close()
