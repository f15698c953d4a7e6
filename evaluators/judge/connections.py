"""Model connection services: create, update, delete, test; and the address check.

A connection's base URL must reach a public address unless ``EVALSITE_MODELS_ALLOW_PRIVATE`` is
on (a self-hosted server must not become a proxy into its own network; local models such as
Ollama or vLLM on the same network need the setting). ``address_problem`` checks at save time
and before every batch, to say so early; ``evalsite.outbound`` checks every request as it is
sent (redirect hops included), since DNS answers can change.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evalsite import outbound
from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Project
from evaluators.crypto import UndecryptableKey
from evaluators.judge.client import Caller, Shared, model_policy
from evaluators.models import ModelConnection
from evaluators.normalize import EvaluationError

TEST_PROMPT = "Reply with the single word OK."


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: float = Field(0.0, ge=0, description="USD per 1M prompt tokens.")
    completion: float = Field(0.0, ge=0, description="USD per 1M completion tokens.")


class ConnectionConfig(BaseModel):
    """Everything about a connection that a person sets, validated in one place."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    base_url: str = Field(min_length=1, max_length=500)
    model_names: list[str] = Field(default_factory=list, max_length=200)
    prices: dict[str, Price] = Field(default_factory=dict)
    rate_limit_rpm: int = Field(600, ge=0, le=1_000_000)
    timeout_seconds: float = Field(60.0, gt=0, le=600)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not hold credentials; put the key in the API key field")
        return url.strip().rstrip("/")

    @field_validator("model_names")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        names = [n.strip() for n in names if n.strip()]
        if len(set(names)) != len(names):
            raise ValueError("a model is listed twice")
        return names


def address_problem(base_url: str) -> str | None:
    """Why evalsite refuses to call this URL's host, or None. Every request is checked again as
    it is sent (``evaluators.judge.client``); this one tells a person at once."""
    policy = model_policy()
    if policy.allow_private:
        return None  # nothing to refuse; the name is looked up when it is called
    try:
        outbound.checked_addresses(base_url, policy)
    except outbound.OutboundError as exc:
        return str(exc)
    return None


def _validated(values: dict[str, Any]) -> dict[str, Any]:
    try:
        config = ConnectionConfig.model_validate(values)
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc))
    problem = address_problem(config.base_url)
    if problem:
        raise InvalidInput({"base_url": [problem]})
    return config.model_dump(mode="json")


@transaction.atomic
def model_connection_create(
    *,
    project: Project,
    name: str,
    base_url: str,
    slug: str = "",
    api_key: str = "",
    model_names: list[str] | None = None,
    prices: dict[str, Any] | None = None,
    rate_limit_rpm: int = 600,
    timeout_seconds: float = 60.0,
    author=None,
) -> ModelConnection:
    values = _validated(
        {
            "name": name,
            "base_url": base_url,
            "model_names": model_names or [],
            "prices": prices or {},
            "rate_limit_rpm": rate_limit_rpm,
            "timeout_seconds": timeout_seconds,
        }
    )
    slug = slug or slugify(name)[:100] or "connection"
    if ModelConnection.objects.for_project(project).filter(slug=slug).exists():
        raise InvalidInput({"slug": [f"A model connection with slug {slug!r} already exists."]})
    connection = ModelConnection(
        project=project, slug=slug, created_by=author if getattr(author, "pk", None) else None
    )
    for key, value in values.items():
        setattr(connection, key, value)
    connection.set_api_key(api_key)
    connection.save()
    return connection


@transaction.atomic
def model_connection_update(
    *, connection: ModelConnection, api_key: str | None = None, **fields: Any
) -> ModelConnection:
    """Change settings; ``api_key`` None or "" keeps the stored key (it is never shown, so an
    empty field means "unchanged"); ``clear_api_key=True`` removes it."""
    clear = fields.pop("clear_api_key", False)
    current = {
        "name": connection.name,
        "base_url": connection.base_url,
        "model_names": connection.model_names,
        "prices": connection.prices,
        "rate_limit_rpm": connection.rate_limit_rpm,
        "timeout_seconds": connection.timeout_seconds,
    }
    slug = fields.pop("slug", None)
    values = _validated({**current, **{k: v for k, v in fields.items() if v is not None}})
    if slug and slug != connection.slug:
        if ModelConnection.objects.for_project(connection.project).filter(slug=slug).exists():
            raise InvalidInput({"slug": [f"A model connection with slug {slug!r} already exists."]})
        connection.slug = slug
    for key, value in values.items():
        setattr(connection, key, value)
    if api_key:
        connection.set_api_key(api_key)
    elif clear:
        connection.set_api_key("")
    if api_key or clear or values["base_url"] != current["base_url"]:
        # A new key or endpoint deserves a fresh start; the next call will tell.
        connection.failing_reason, connection.failing_since = "", None
    connection.updated_at = timezone.now()
    connection.save()
    return connection


def model_connection_delete(*, connection: ModelConnection) -> None:
    connection.delete()


def model_connection_test(*, connection: ModelConnection, model: str = "") -> dict[str, Any]:
    """Send one tiny request through the shared limiter; mark the connection by the result.

    Returns ``{ok, model, latency_ms, answer?, tokens?, error?}``; never raises for a failing
    endpoint.
    """
    model = model or (connection.model_names or [""])[0]
    result: dict[str, Any] = {"ok": False, "model": model, "latency_ms": None}
    started = time.perf_counter()
    try:
        if not model:
            raise EvaluationError("The connection lists no model; add one.", code="no_model")
        problem = address_problem(connection.base_url)
        if problem:
            raise EvaluationError(problem, code="connection_address_refused")
        shared = Shared(connection, spend_scope="test", max_cost_usd=None)
        caller = Caller(shared, model=model, max_retries=0, max_tokens=16, temperature=0)
        reply = caller.chat([{"role": "user", "content": TEST_PROMPT}])
    except UndecryptableKey as exc:
        result["error"] = {"code": "no_key", "message": str(exc)}
    except EvaluationError as exc:
        result["error"] = {"code": exc.code, "message": exc.message}
        if exc.code == "connection_auth_failed":
            connection.mark_failing(shared.refusal)
    else:
        result.update(
            ok=True,
            answer=reply.content[:200],
            tokens={"prompt": reply.prompt_tokens, "completion": reply.completion_tokens},
        )
        connection.mark_healthy()
    result["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return result
