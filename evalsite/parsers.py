"""The API's JSON parser, named in settings (``DEFAULT_PARSER_CLASSES``).

A module of its own: DRF imports it while it builds ``APIView``, so it must not import
``rest_framework.views`` (``evalsite.rest`` does, for the exception handler), or the two wait
on each other half-imported.
"""

from __future__ import annotations

from rest_framework import exceptions, parsers

from evalsite import jsonsafe


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser through ``evalsite.jsonsafe``: no NaN, no nesting past the limit."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            return jsonsafe.loads(stream.read().decode(encoding))
        except (jsonsafe.UnsafeJSON, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(f"JSON parse error: {exc}")
