"""Turn input PostgreSQL cannot take into a 400 page instead of a 500."""

from __future__ import annotations

from django.db import DataError
from django.shortcuts import render


class BadInputMiddleware:
    """A NUL character or an out-of-range number in a search box is the user's input, not a
    server failure. (The REST API does the same in ``evalsite.rest.exception_handler``.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, DataError):
            context = {
                "message": "A value in this request cannot be stored or searched (e.g. it contains a NUL character)."
            }
            return render(request, "400.html", context, status=400)
        return None
