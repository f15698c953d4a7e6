"""A run's tags: free-form labels (branch, commit, pr) that lists filter on and gates look up."""

from __future__ import annotations

import re
from typing import Any

from evalsite.errors import InvalidInput

MAX_TAGS = 20
TAG_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,64}$")
TAG_VALUE_MAX = 200


def tags_validate(tags: Any) -> dict[str, str]:
    """A run's tags: at most 20 names (letters, digits, ``_ . - /``, up to 64) to texts (up
    to 200 characters; numbers are kept as their text)."""
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise InvalidInput({"tags": ['must be an object of names to texts: {"branch": "main"}']})
    if len(tags) > MAX_TAGS:
        raise InvalidInput({"tags": [f"at most {MAX_TAGS} tags, got {len(tags)}"]})
    clean = {}
    for name, value in tags.items():
        if not TAG_NAME.match(str(name)):
            raise InvalidInput(
                {f"tags.{str(name)[:64]}": ["a tag name is 1-64 letters, digits, _ . - or /"]}
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise InvalidInput({f"tags.{name}": ["must be a text"]})
        text = str(value)
        if len(text) > TAG_VALUE_MAX or "\x00" in text:
            raise InvalidInput(
                {f"tags.{name}": [f"at most {TAG_VALUE_MAX} characters, no NUL characters"]}
            )
        clean[str(name)] = text
    return clean
