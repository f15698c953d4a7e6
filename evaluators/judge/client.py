"""One chat-completions request, made the careful way.

``Caller.chat(messages)`` waits for the connection's shared rate limiter, checks the spend cap,
sends the request with the official ``openai`` client over an ``evalsite.outbound`` client (only
the addresses ``EVALSITE_MODELS_ALLOW_PRIVATE`` allows, checked on every request and redirect hop,
the connection pinned to the checked address, the answer bounded), and retries 429, 5xx,
timeouts and refused connections with ``outbound.Backoff`` (exponential, full jitter, honouring
``Retry-After`` / ``retry-after-ms``; a 429 that names one holds the whole connection back, on
every worker). The SDK's own retries are off: they would hide attempts from the trace, could not
hold the other workers back, and would not check the spend cap between attempts. After
``max_retries`` retries the call fails with an ``EvaluationError``; it never turns into a score.
401 and 403 fail at once and mark the whole batch (and the connection) as refused; an address
refused by the outbound check fails at once too. Every attempt is recorded, for the judge's trace.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import redis

from evalsite import outbound
from evalsite.jsonpaths import dig
from evaluators.judge.conf import setting
from evaluators.judge.limits import Limiter, RateLimited, SpendCounter
from evaluators.normalize import EvaluationError

if TYPE_CHECKING:
    import openai

BACKOFF_BASE_S = 0.25
SNIPPET = 300


@dataclass
class Attempt:
    """One HTTP request to the model, as the trace shows it."""

    started: datetime
    duration_ms: float
    status: int | None = None  # HTTP status; None when no answer came
    error: str = ""
    waited_ms: float = 0.0  # in the rate limiter, before sending
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Reply:
    content: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    model: str


@dataclass
class Usage:
    """Everything one cell's model calls used, attempts included."""

    attempts: list[Attempt] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None

    def add(self, reply: Reply) -> None:
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        if reply.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + reply.cost_usd


def model_policy() -> outbound.Policy:
    """Where model connections may call: public addresses, unless EVALSITE_MODELS_ALLOW_PRIVATE."""
    return outbound.Policy(
        allow_private=bool(setting("EVALSITE_MODELS_ALLOW_PRIVATE")),
        setting="EVALSITE_MODELS_ALLOW_PRIVATE",
        caller="Model connections",
    )


def model_http_client(policy: outbound.Policy, timeout: float) -> httpx.Client:
    """What the openai client sends through. Redirects are followed (gateways redirect), each hop
    checked by ``policy`` like the first request; the pool is as large as the SDK's own."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    return outbound.client(policy, timeout=timeout, follow_redirects=True, limits=limits)


@functools.lru_cache(maxsize=64)
def _openai_client(
    base_url: str, api_key: str, timeout: float, policy: outbound.Policy
) -> openai.OpenAI:
    # Cached so keep-alive connections outlive one batch. The key and the policy are part of the
    # cache key, so a changed key or setting builds a new client. openai takes a second to
    # import: imported here, only the processes that call a model pay for it, not every web
    # worker and manage.py command.
    import openai

    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key or "none",
        max_retries=0,
        timeout=timeout,
        http_client=model_http_client(policy, timeout),
    )


# A forked worker (Celery prefork) must not share its parent's connections.
os.register_at_fork(after_in_child=_openai_client.cache_clear)


def openai_client(connection) -> openai.OpenAI:
    return _openai_client(
        connection.base_url, connection.api_key(), connection.timeout_seconds, model_policy()
    )


class Shared:
    """What the calls of one batch share: the limiter, the spend counter, the refusal flag."""

    def __init__(self, connection, *, spend_scope: str, max_cost_usd: float | None) -> None:
        self.connection = connection
        self.client = openai_client(connection)
        self.limiter = Limiter(connection.pk, connection.rate_limit_rpm)
        self.spend = SpendCounter(spend_scope) if max_cost_usd is not None else None
        self.max_cost_usd = max_cost_usd
        self.refused = threading.Event()
        self.refusal = ""
        self.structured_unsupported = threading.Event()

    def refuse(self, reason: str) -> None:
        self.refusal = reason
        self.refused.set()


class Caller:
    """Makes the model calls of one cell."""

    def __init__(self, shared: Shared, *, model: str, max_retries: int, **options: Any) -> None:
        self.shared = shared
        self.model = model
        self.max_retries = max_retries
        self.options = options  # temperature, max_tokens, response_format
        self.usage = Usage()

    def chat(self, messages: list[dict[str, str]]) -> Reply:
        """The model's reply, or ``EvaluationError`` once retrying is over (see the module)."""
        try:
            return self._chat(messages)
        except redis.RedisError as exc:
            raise EvaluationError(
                f"Redis (REDIS_URL), which holds the shared rate limits and spend counters, "
                f"is unavailable: {exc}",
                code="rate_limiter_unavailable",
            )

    def _chat(self, messages: list[dict[str, str]]) -> Reply:
        retries = 0
        while True:
            self._check_before_call()
            waited = self._wait_for_slot()
            self._check_before_call()
            try:
                return self._send(messages, waited)
            except _Retry as retry:
                if retry.free:
                    continue
                if retry.after is not None and retry.status == 429:
                    # The server's word holds for every caller of this connection, everywhere.
                    wait_cap = setting("EVALSITE_JUDGE_MAX_WAIT_SECONDS")
                    self.shared.limiter.block(min(retry.after, wait_cap))
                if retries == self.max_retries:
                    raise self._gave_up(retry.error) from None
                retries += 1
                pause = retry.after if retry.after is not None else self._backoff(retries)
                if pause > setting("EVALSITE_JUDGE_MAX_BACKOFF_SECONDS"):
                    raise EvaluationError(
                        f"{retry.error.message} The model asked to wait {pause:g} s, more than "
                        f"EVALSITE_JUDGE_MAX_BACKOFF_SECONDS allows.",
                        code=retry.error.code,
                    ) from None
                time.sleep(pause)

    def _gave_up(self, error: EvaluationError) -> EvaluationError:
        tries = len(self.usage.attempts)
        return EvaluationError(
            f"{error.message} Gave up after {tries} attempt{'s' if tries > 1 else ''}.",
            code=error.code,
        )

    def _check_before_call(self) -> None:
        shared = self.shared
        if shared.refused.is_set():
            raise EvaluationError(
                f"The model connection {shared.connection.slug!r} refused the key: "
                f"{shared.refusal}",
                code="connection_auth_failed",
            )
        if shared.spend is not None and shared.spend.total() >= shared.max_cost_usd:
            raise EvaluationError(
                f"The spend cap of ${shared.max_cost_usd:g} (max_cost_usd) is reached: this run "
                f"has spent ${shared.spend.total():.4f} on judge calls. No further calls are made.",
                code="spend_cap_reached",
            )

    def _wait_for_slot(self) -> float:
        deadline = time.monotonic() + setting("EVALSITE_JUDGE_MAX_WAIT_SECONDS")
        try:
            return self.shared.limiter.acquire(deadline)
        except RateLimited as exc:
            raise EvaluationError(
                f"The model connection {self.shared.connection.slug!r} is at its rate limit "
                f"({self.shared.connection.rate_limit_rpm}/min) and the next slot is "
                f"{exc.wait_s:.0f} s away, more than EVALSITE_JUDGE_MAX_WAIT_SECONDS.",
                code="rate_limited",
            )

    def _send(self, messages: list[dict[str, str]], waited_s: float) -> Reply:
        import openai  # already loaded by _openai_client

        options = dict(self.options)
        if self.shared.structured_unsupported.is_set():
            options.pop("response_format", None)
        started, clock = datetime.now(UTC), time.perf_counter()
        attempt = Attempt(started, 0.0, waited_ms=round(waited_s * 1000, 3))
        self.usage.attempts.append(attempt)
        try:
            raw = self.shared.client.chat.completions.with_raw_response.create(
                model=self.model, messages=messages, **options
            )
            completion = raw.parse()
            attempt.status = raw.status_code
        except openai.APIStatusError as exc:
            attempt.status = exc.status_code
            attempt.error = _snippet(exc)
            raise self._failure(exc, options) from None
        except openai.APITimeoutError:
            attempt.error = "timed out"
            timeout = self.shared.connection.timeout_seconds
            raise _Retry(EvaluationError(
                f"The model did not answer within {timeout:g} s.", code="model_timeout"
            ))  # fmt: skip
        except openai.APIConnectionError as exc:
            attempt.error = f"connection failed: {exc.__cause__ or exc}"
            if isinstance(exc.__cause__, outbound.Refused):
                raise EvaluationError(str(exc.__cause__), code="connection_address_refused")
            if isinstance(exc.__cause__, outbound.TooLarge | outbound.Compressed):
                raise EvaluationError(
                    f"The model endpoint's answer was refused: {exc.__cause__}", code="model_error"
                )
            raise _Retry(EvaluationError(
                f"The model endpoint could not be reached: {exc.__cause__ or exc}",
                code="model_unreachable",
            ))  # fmt: skip
        finally:
            attempt.duration_ms = round((time.perf_counter() - clock) * 1000, 3)
        return self._reply(completion, attempt)

    def _reply(self, completion, attempt: Attempt) -> Reply:
        usage = getattr(completion, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        done = int(getattr(usage, "completion_tokens", 0) or 0)
        attempt.prompt_tokens, attempt.completion_tokens = prompt, done
        choices = getattr(completion, "choices", None) or []
        message = choices[0].message if choices else None
        content = (getattr(message, "content", None) or "") if message else ""
        if not content and message is not None and getattr(message, "refusal", None):
            content = str(message.refusal)
        reply = Reply(content, prompt, done, self._cost(prompt, done), self.model)
        self.usage.add(reply)
        if self.shared.spend is not None and reply.cost_usd:
            self.shared.spend.add(reply.cost_usd)
        return reply

    def _cost(self, prompt: int, completion: int) -> float | None:
        price = self.shared.connection.price_of(self.model)
        if price is None:
            return None
        return (
            prompt * float(price.get("prompt", 0)) + completion * float(price.get("completion", 0))
        ) / 1_000_000

    def _failure(self, exc: openai.APIStatusError, options: dict) -> Exception:
        status = exc.status_code
        detail = _snippet(exc)
        if status in (401, 403):
            reason = f"HTTP {status} from {self.shared.connection.base_url}: {detail}"
            self.shared.refuse(reason)
            return EvaluationError(
                f"The model connection {self.shared.connection.slug!r} refused the key ({reason}).",
                code="connection_auth_failed",
            )
        if status == 429 or status >= 500 or status == 408:
            what = "rate limited the call" if status == 429 else f"answered HTTP {status}"
            code = "rate_limited" if status == 429 else "model_unavailable"
            return _Retry(
                EvaluationError(f"The model endpoint {what}: {detail}", code=code),
                after=outbound.retry_after(exc.response.headers),
                status=status,
            )
        if status == 400 and "response_format" in options and _about_format(detail):
            # Not every OpenAI-compatible server has structured outputs; the prompt still asks
            # for JSON and the answer is parsed (with one repair) all the same.
            self.shared.structured_unsupported.set()
            return _Retry(EvaluationError(detail, code="model_error"), free=True)
        return EvaluationError(
            f"The model endpoint answered HTTP {status}: {detail}", code="model_error"
        )

    @staticmethod
    def _backoff(attempt: int) -> float:
        cap = setting("EVALSITE_JUDGE_MAX_BACKOFF_SECONDS")
        return outbound.Backoff(BACKOFF_BASE_S, cap).pause(attempt)


class _Retry(Exception):
    """A transient failure. ``free``: try again at once without counting a retry."""

    def __init__(
        self, error: EvaluationError, *, after: float | None = None, status=None, free=False
    ):
        super().__init__(error.message)
        self.error = error
        self.after = after
        self.status = status
        self.free = free


def _snippet(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message") or dig(body, "error.message")
        if message:
            return str(message)[:SNIPPET]
    try:
        text = exc.response.text
    except Exception:  # a streamed or unreadable body
        text = str(exc)
    return (text or str(exc))[:SNIPPET]


def _about_format(detail: str) -> bool:
    lowered = detail.lower()
    return any(word in lowered for word in ("response_format", "json_schema", "structured"))
