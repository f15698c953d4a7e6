"""REST plumbing named in settings (kept free of heavy imports: DRF loads it while starting)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DataError, IntegrityError
from django.http import Http404
from rest_framework import exceptions, pagination
from rest_framework.views import exception_handler as drf_exception_handler

from evalsite.errors import InvalidInput


class RequestTooLarge(exceptions.APIException):
    status_code = 413
    default_code = "request_too_large"


class CursorPagination(pagination.CursorPagination):
    ordering = "-id"
    page_size_query_param = "limit"
    max_page_size = 500


def exception_handler(exc, context):
    """Every error body has one shape: ``{"error": {status, code, message, fields}}``.

    ``fields`` maps a field (dotted for nested ones) to its reasons, so a client can show each
    message beside the input that caused it.
    """
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(exc, InvalidInput):
        status = exc.status
        exc = exceptions.ValidationError(exc.fields)
        exc.status_code = status  # 422 for well-formed data the evaluator's schema refuses,
        # 429 for a project over its interactive quota (evalsite.quotas.Busy)
    elif isinstance(exc, Http404 | ObjectDoesNotExist):
        # ObjectDoesNotExist: the row vanished between the lookup and the service (a
        # concurrent delete); to the caller it is simply not there.
        exc = exceptions.NotFound()
    elif isinstance(exc, DataError):
        # Values PostgreSQL cannot store or compare (a NUL character, a number out of range).
        message = "A value in this request cannot be stored or searched (e.g. it contains a NUL character)."
        exc = exceptions.ValidationError({"non_field_errors": [message]})
    elif isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(
            f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes "
            f"(EVALSITE_MAX_BODY_BYTES)."
        )
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, IntegrityError):
        exc = exceptions.ValidationError(
            {"non_field_errors": ["This conflicts with an existing object."]}
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    fields = _flatten(response.data) if isinstance(exc, exceptions.ValidationError) else {}
    if fields:
        message = "; ".join(f"{name}: {reasons[0]}" for name, reasons in fields.items())
    else:
        message = str(getattr(exc, "detail", exc))
    response.data = {
        "error": {
            "status": response.status_code,
            "code": _code(exc),
            "message": message,
            "fields": fields,
        }
    }
    return response


def _code(exc) -> str:
    codes = exc.get_codes() if hasattr(exc, "get_codes") else None
    if isinstance(codes, str):
        return codes
    return getattr(exc, "default_code", "error")


def _flatten(data, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(data, list) and all(not isinstance(item, dict | list) for item in data):
        return {prefix or "non_field_errors": [str(item) for item in data]}
    flat: dict[str, list[str]] = {}
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict | list):
            flat.update(_flatten(value, name))
        else:
            flat[name] = [str(value)]
    return flat
