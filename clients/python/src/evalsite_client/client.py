"""The HTTP client: one httpx session against an evalsite's REST API (/api/v1)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import httpx

from evalsite_client.models import (
    Application,
    Comparison,
    Estimate,
    History,
    Project,
    Run,
    ScenarioTable,
    Testset,
)

DEFAULT_TIMEOUT = 60.0
FILE_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json"}


RETRIES = 4
RETRY_AFTER_MAX = 30.0


def _backoff(attempt: int) -> float:
    return float(2**attempt)


def _retry_after(response: httpx.Response, attempt: int) -> float:
    try:
        return min(max(float(response.headers.get("Retry-After", "")), 0.0), RETRY_AFTER_MAX)
    except ValueError:
        return _backoff(attempt)


class ConfigError(Exception):
    """EVALSITE_URL / EVALSITE_API_KEY missing or unusable."""


class ApiError(Exception):
    """A 4xx/5xx answer: ``status`` and the decoded body (evalsite's one error shape:
    ``{"error": {"code", "message", "fields": {name: [reasons]}}}``)."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status, self.body, self.method, self.path = status, body, method, path
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")

    @property
    def message(self) -> str:
        """The server's message (it names each field with its first reason)."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        if not isinstance(error, dict):
            return " ".join(str(self.body).split())[:500]
        fields = error.get("fields") or {}
        named = "; ".join(f"{name}: {' '.join(map(str, why))}" for name, why in fields.items())
        return error.get("message") or named or f"HTTP {self.status}"


class Client:
    """``Client()`` reads EVALSITE_URL and EVALSITE_API_KEY; both can be passed instead."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url = url or os.environ.get("EVALSITE_URL", "")
        api_key = api_key or os.environ.get("EVALSITE_API_KEY", "")
        if not url:
            raise ConfigError("Set EVALSITE_URL to your evalsite (https://evals.example.com).")
        if not api_key:
            raise ConfigError("Set EVALSITE_API_KEY to an API key of your project.")
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url + "/api/v1/",
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "evalsite-client"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """``path`` is relative to /api/v1/ ("runs/12"). Returns the decoded JSON (None for 204).

        A 429 (the project's interactive quota, a rate limit: nothing was done) is asked again
        after its ``Retry-After``, whatever the method; a GET is also asked again after a
        502 / 503 / 504 or a failed connection (a proxy restarting, a deploy). Both up to
        ``RETRIES`` times with a growing pause, so one hiccup does not fail a CI job."""
        for attempt in range(RETRIES + 1):
            last = attempt == RETRIES
            try:
                response = self.http.request(method, path.lstrip("/"), **kwargs)
            except httpx.TransportError:
                if method != "GET" or last:
                    raise
                time.sleep(_backoff(attempt))
                continue
            retry = response.status_code == 429 or (
                method == "GET" and response.status_code in (502, 503, 504)
            )
            if retry and not last:
                time.sleep(_retry_after(response, attempt))
                continue
            if response.status_code >= 400:
                raise _api_error(response, method, path)
            if response.status_code == 204 or not response.content:
                return None
            return response.json()
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=json, **kwargs)

    def patch(self, path: str, json: Any = None) -> Any:
        return self.request("PATCH", path, json=json)

    def put(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.request("PUT", path, json=json, **kwargs)

    def pages(self, path: str, **params: Any) -> Iterator[dict]:
        """Every item of a cursor-paginated list (``{"next", "previous", "results"}``)."""
        page = self.get(path, **params)
        while True:
            yield from page["results"]
            if not page.get("next"):
                return
            page = self.request("GET", self._relative(page["next"]))

    def _relative(self, url: str) -> str:
        """A ``next`` link as a path below /api/v1/: the key only ever goes to ``self.url`` (a
        proxy that makes the server see http:// must not send the next request in clear)."""
        parts = urlsplit(url)
        path = parts.path.split("/api/v1/", 1)[-1]
        return f"{path}?{parts.query}" if parts.query else path

    def web_url(self, path: str) -> str:
        """A page of the site (for links in reports): ``web_url("/p/acme/runs/12/")``."""
        return self.url + path

    # --- typed calls (models.py) ----------------------------------------------------------------

    def project(self) -> Project:
        """The project of the API key (its slug makes the page links)."""
        return Project.model_validate(self.get("project"))

    def testset(self, ref: str | int) -> Testset | None:
        try:
            return Testset.model_validate(self.get(f"testsets/{ref}"))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def testset_upload(self, ref: str, path: str | Path, *, message: str = "") -> Testset:
        """Upload a CSV / JSON / JSONL file as the new version of testset ``ref`` (every row
        replaced), or as a new testset with that slug when there is none yet."""
        path = Path(path)
        fmt = FILE_FORMATS.get(path.suffix.lower(), "")
        with path.open("rb") as handle:
            files = {"file": (path.name, handle, "application/octet-stream")}
            data = {"format": fmt, "message": message or f"Uploaded {path.name} (evalsite CLI)"}
            if self.testset(ref) is not None:
                body = self.put(f"testsets/{ref}/rows", files=files, data=data)
            else:
                data |= {"name": str(ref), "slug": "" if str(ref).isdecimal() else str(ref)}
                body = self.post("testsets", files=files, data=data)
        return Testset.model_validate(body)

    def testset_export(
        self, ref: str | int, out: BinaryIO, *, format: str = "jsonl", version: int | None = None
    ) -> None:
        """Stream a testset version's rows (csv, json or jsonl) into ``out``."""
        params = {"format": format} | ({"version": version} if version is not None else {})
        with self.http.stream("GET", f"testsets/{ref}/export", params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise _api_error(response, "GET", f"testsets/{ref}/export")
            for chunk in response.iter_bytes():
                out.write(chunk)

    def applications(self) -> list[Application]:
        return [Application.model_validate(a) for a in self.get("applications")]

    def application_create(
        self, *, name: str, kind: str, slug: str = "", config: dict | None = None
    ) -> Application:
        body = {"name": name, "slug": slug, "kind": kind, "config": config or {}}
        return Application.model_validate(self.post("applications", body))

    def run(self, run_id: int | str) -> Run:
        return Run.model_validate(self.get(f"runs/{run_id}"))

    def run_create(self, **fields: Any) -> Run:
        """``POST /runs``: name, testset, testset_version, application, evaluators, repeats,
        tags, max_cost_usd, start, description (None values are left out)."""
        return Run.model_validate(self.post("runs", _body(fields)))

    def run_estimate(self, **fields: Any) -> Estimate:
        """What ``run_create`` with the same fields would cost; creates nothing."""
        # "start": false too: a server that does not know dry_run then creates a pending run
        # (cancelled below) instead of starting one.
        body = self.post("runs", _body({**fields, "dry_run": True, "start": False}))
        if "estimate" not in body:  # a server without dry_run created the run: undo that
            if "id" in body:
                self.run_action(body["id"], "cancel")
            raise ApiError(
                400, {"error": {"message": "This evalsite has no dry_run."}}, "POST", "runs"
            )
        return Estimate.model_validate(body["estimate"])

    def runs(
        self,
        *,
        testset: str | int | None = None,
        tags: dict[str, str] | None = None,
        status: str | None = None,
        search: str | None = None,
    ) -> Iterator[Run]:
        """The project's runs, newest first; every tag given must match."""
        tag = [f"{name}:{value}" for name, value in (tags or {}).items()] or None
        params = {"testset": testset, "tag": tag, "status": status, "search": search}
        for item in self.pages("runs", **params):
            yield Run.model_validate(item)

    def run_update(self, run_id: int | str, **fields: Any) -> Run:
        """``PATCH /runs/{id}``: tags (replaced as a whole), name, description."""
        return Run.model_validate(self.patch(f"runs/{run_id}", _body(fields)))

    def run_action(self, run_id: int | str, action: str) -> Run:
        """start, cancel, retry or close."""
        return Run.model_validate(self.post(f"runs/{run_id}/{action}"))

    def compare(
        self,
        baseline: int,
        candidate: int,
        *,
        metric: str = "",
        filter: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> Comparison:
        body = self.get(
            "runs/compare",
            runs=f"{baseline},{candidate}",
            baseline=baseline,
            metric=metric or None,
            filter=filter or None,
            offset=offset or None,
            limit=limit,
        )
        return Comparison.model_validate(body)

    def history(
        self,
        testset: str | int,
        *,
        baseline: int | None = None,
        candidate: int | None = None,
        evaluator: str | None = None,
        classes: Iterable[str] = (),
        tags: dict[str, str] | None = None,
    ) -> History:
        """Each test case's verdicts in the testset's last runs (those with ``tags``, plus the
        baseline and the candidate) and its class."""
        tag = [f"{name}:{value}" for name, value in (tags or {}).items()] or None
        body = self.get(
            f"testsets/{testset}/history",
            baseline=baseline,
            candidate=candidate,
            evaluator=evaluator,
            tag=tag,
            **{"class": list(classes) or None},
        )
        return History.model_validate(body)

    def scenario_table(
        self, run_id: int | str, *, offset: int = 0, limit: int = 500
    ) -> ScenarioTable:
        body = self.get(f"runs/{run_id}/scenarios", offset=offset, limit=limit)
        return ScenarioTable.model_validate(body)

    def scenario_tables(self, run_id: int | str) -> Iterator[ScenarioTable]:
        """Every page of a run's scenario table, 500 rows at a time."""
        offset = 0
        while True:
            table = self.scenario_table(run_id, offset=offset)
            yield table
            offset += len(table.rows)
            if not table.rows or offset >= table.count:
                return


def _api_error(response: httpx.Response, method: str, path: str) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return ApiError(response.status_code, body, method, path)


def _body(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}
