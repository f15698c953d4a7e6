"""Every model is in the admin, and each changelist and change page renders for a superuser."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from evalsite.demo import demo_load


@pytest.fixture
def superuser_client(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(user)
    return client


def test_it_registers_every_model_of_our_apps():
    ours = [m for m in apps.get_models() if m._meta.app_label in ("evalsite", "evaluators", "runs")]
    missing = [m.__name__ for m in ours if not admin.site.is_registered(m)]
    assert missing == []


def test_it_renders_every_changelist_and_a_change_page(superuser_client):
    demo_load()
    for model in admin.site._registry:
        if model._meta.app_label not in ("evalsite", "evaluators", "runs"):
            continue
        info = (model._meta.app_label, model._meta.model_name)
        response = superuser_client.get(reverse(f"admin:{info[0]}_{info[1]}_changelist"))
        assert response.status_code == 200, info
        obj = model.objects.first()
        if obj is not None:
            response = superuser_client.get(
                reverse(f"admin:{info[0]}_{info[1]}_change", args=[obj.pk])
            )
            assert response.status_code == 200, info
