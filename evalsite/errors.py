"""The one error type services raise for bad input, understood by the API and the pages."""

from __future__ import annotations

from pydantic import ValidationError as PydanticValidationError


class InvalidInput(Exception):
    """Bad input named by field: ``fields`` maps a (dotted) field to its reasons."""

    status = 400

    def __init__(self, fields: dict[str, list[str]] | str, message: str = "", *, status: int = 400):
        self.status = status
        if isinstance(fields, str):
            fields = {"non_field_errors": [fields]}
        self.fields = fields
        first = next(iter(fields.items()))
        super().__init__(message or f"{first[0]}: {first[1][0]}")


def pydantic_fields(exc: PydanticValidationError, prefix: str = "") -> dict[str, list[str]]:
    """Turn pydantic's errors into ``{"parameters.pattern": ["not a valid regular expression"]}``."""
    fields: dict[str, list[str]] = {}
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        name = ".".join(part for part in (prefix, path) if part) or "non_field_errors"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting for this kind"
        fields.setdefault(name, []).append(message)
    return fields
