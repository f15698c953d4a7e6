"""A real OpenAI-compatible chat-completions server on 127.0.0.1, for judge tests.

Built on ``tests.servers.LocalServer``. A test says what the model answers, either one answer for
every call (``llm_server.answer = ...``) or a queue consumed call by call whose last item repeats
(``llm_server.queue(...)``). An answer is a dict (sent as the JSON text of the message), a string
(the message text as is), or a ``tests.servers.Reply`` for anything else (429s, delays, ...);
``completion()`` and ``failure()`` build such replies. ``llm_server.calls`` holds every chat
request received (``.json()`` is the body the client sent).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.servers import LocalServer, Received, Reply

Answer = dict | str | Reply
MODEL_API_KEY = "sk-test-0123456789abcdef-SECRET"  # what llm_connection stores


def completion(
    content: str | dict,
    *,
    prompt_tokens: int = 100,
    completion_tokens: int = 20,
    model: str = "judge-1",
    delay: float = 0.0,
    headers: dict[str, str] | None = None,
) -> Reply:
    text = content if isinstance(content, str) else json.dumps(content)
    body = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return Reply(200, body, headers=dict(headers or {}), delay=delay)


def failure(status: int, message: str = "", *, headers: dict[str, str] | None = None) -> Reply:
    body = {"error": {"message": message or f"HTTP {status}", "type": "test", "code": None}}
    return Reply(status, body, headers=dict(headers or {}))


class FakeLLM:
    def __init__(self) -> None:
        self.server = LocalServer()
        self.server.handler = self._handle
        self.url = f"{self.server.url}/v1"
        self.answer: Answer | Callable[[Received], Answer] = {"reasoning": "ok", "score": 1.0}
        self._queue: list[Answer] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> list[Received]:
        return [r for r in self.server.requests if r.path.endswith("/chat/completions")]

    def queue(self, *answers: Answer) -> None:
        with self._lock:
            self._queue = list(answers)

    def _next(self, request: Received) -> Answer:
        with self._lock:
            if self._queue:
                return self._queue.pop(0) if len(self._queue) > 1 else self._queue[0]
        return self.answer(request) if callable(self.answer) else self.answer

    def _handle(self, request: Received) -> Reply:
        if not request.path.endswith("/chat/completions"):
            return failure(404, "not found")
        answer = self._next(request)
        if isinstance(answer, Reply):
            return answer
        return completion(answer, model=request.json().get("model", "judge-1"))

    def close(self) -> None:
        self.server.close()


def clear_judge_state() -> None:
    """Forget rate limiters and spend counters left by earlier tests in this Redis database."""
    from evalsite.redis_client import site_key
    from evaluators.judge.limits import client

    keys = list(client().scan_iter(match=site_key("llm", "*"), count=1000))
    if keys:
        client().delete(*keys)


@pytest.fixture
def llm_server(settings) -> Any:
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = True
    clear_judge_state()
    server = FakeLLM()
    yield server
    server.close()


@pytest.fixture
def llm_connection(project, llm_server):
    """The project's model connection "local" to ``llm_server``: model judge-1, priced."""
    from evaluators.judge.connections import model_connection_create

    return model_connection_create(
        project=project,
        name="Local",
        base_url=llm_server.url,
        api_key=MODEL_API_KEY,
        model_names=["judge-1", "judge-2"],
        prices={"judge-1": {"prompt": 1.0, "completion": 2.0}},
        rate_limit_rpm=6000,
        timeout_seconds=5.0,
    )
