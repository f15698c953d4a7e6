"""Safe defaults: the demo account (whose password every start prints) is an ordinary owner of
the demo project, never staff, and is not created on a site others can reach unless asked."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from evalsite.demo import DEMO_USER, demo_load
from evalsite.management.commands.up import is_loopback
from evalsite.models import Role

pytestmark = pytest.mark.django_db


def test_the_demo_account_owns_the_demo_project_and_is_not_staff(client):
    project = demo_load()
    user = get_user_model().objects.get(username=DEMO_USER)
    assert not user.is_staff and not user.is_superuser
    assert project.role_of(user) == Role.OWNER
    client.force_login(user)
    admin = client.get("/admin/")
    assert admin.status_code == 302 and "/admin/login/" in admin["Location"]
    assert client.get("/admin/evalsite/apikey/").status_code == 302


def test_loading_the_demo_again_takes_back_staff_rights_an_older_version_gave(db):
    demo_load()
    User = get_user_model()
    User.objects.filter(username=DEMO_USER).update(is_staff=True, is_superuser=True)
    demo_load()
    user = User.objects.get(username=DEMO_USER)
    assert not user.is_staff and not user.is_superuser


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_up_refuses_the_demo_account_on_a_non_loopback_bind(host):
    with pytest.raises(CommandError, match="Refusing to create the demo account"):
        call_command("up", host=host, port="0")
    # Refused before anything happened: no demo account, no demo project.
    assert not get_user_model().objects.filter(username=DEMO_USER).exists()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
    ],
)
def test_it_tells_loopback_binds_from_reachable_ones(host, loopback):
    assert is_loopback(host) is loopback
