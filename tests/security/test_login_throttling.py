"""Sign-in boundary: guessing passwords is throttled per account and per address (django-axes),
with a page that says why; a right password before the limit still works."""

from __future__ import annotations

import pytest
from django.conf import settings

pytestmark = pytest.mark.django_db


def _sign_in(client, username: str, password: str, address: str = "203.0.113.7"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_it_locks_an_account_after_the_failure_limit_with_a_clear_message(client, owner):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _sign_in(client, "alice", "wrong").status_code == 200
    response = _sign_in(client, "alice", "wrong")
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed sign-ins" in page and "15 minutes" in page
    # Even the right password waits now, from another address too: the account is paused.
    assert _sign_in(client, "alice", "pw-alice-123", address="198.51.100.9").status_code == 429
    assert "_auth_user_id" not in client.session


def test_it_locks_an_address_that_guesses_across_many_accounts(client, owner):
    for number in range(settings.AXES_FAILURE_LIMIT):
        _sign_in(client, f"nobody{number}", "wrong", address="203.0.113.50")
    assert _sign_in(client, "alice", "pw-alice-123", address="203.0.113.50").status_code == 429
    # Another address signs in to the same account.
    response = _sign_in(client, "alice", "pw-alice-123", address="198.51.100.9")
    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(owner.pk)


def test_a_forwarded_for_header_does_not_dodge_the_address_limit(client, owner):
    for number in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            "/login/",
            {"username": f"x{number}", "password": "wrong"},
            REMOTE_ADDR="203.0.113.60",
            HTTP_X_FORWARDED_FOR=f"192.0.2.{number}",
        )
    assert _sign_in(client, "alice", "pw-alice-123", address="203.0.113.60").status_code == 429


def test_a_success_before_the_limit_clears_the_count(client, owner):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _sign_in(client, "alice", "wrong")
    assert _sign_in(client, "alice", "pw-alice-123").status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _sign_in(client, "alice", "wrong").status_code == 200
