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


def tag_filters_parse(values: list[str]) -> dict[str, str]:
    """Filters from query parameters, one ``tag=name:value`` each (repeatable; the value may
    hold colons and commas): ``["branch:main", "pr:12"]`` -> ``{"branch": "main", "pr": "12"}``."""
    tags = {}
    for value in values:
        name, sep, text = value.partition(":")
        if not sep or not TAG_NAME.match(name):
            raise InvalidInput({"tag": [f"{value!r}: write a tag as name:value (branch:main)"]})
        tags[name] = text
    return tags


def tags_text_parse(text: str, sep: str = "=") -> dict[str, str]:
    """Tags typed in one box, comma-separated: ``branch=main, pr=482`` (``sep`` "=") or
    ``branch:main, pr:482`` (``sep`` ":"). Names are checked by ``tags_validate``."""
    tags = {}
    for part in (p.strip() for p in text.replace("\n", ",").split(",")):
        if not part:
            continue
        name, found, value = part.partition(sep)
        if not found or not name.strip():
            example = "branch=main, pr=12" if sep == "=" else "branch:main"
            raise InvalidInput({"tags": [f"{part!r}: write tags as {example}"]})
        tags[name.strip()] = value.strip()
    return tags
