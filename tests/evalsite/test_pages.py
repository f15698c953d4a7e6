"""Tenancy pages: login, projects, settings and API keys, with the owner/viewer/outsider cast."""

from evalsite.models import ApiKey


def test_it_sends_anonymous_visitors_to_login(client, db):
    response = client.get("/")
    assert response.status_code == 302
    assert response.url.startswith("/login/")


def test_it_logs_in_with_a_password(client, owner, project):
    response = client.post("/login/", {"username": "alice", "password": "pw-alice-123"})
    assert response.status_code == 302
    response = client.get("/", follow=True)
    assert response.redirect_chain[-1][0] == "/p/acme/"
    assert b"Acme QA" in response.content


def test_it_shows_a_clear_error_for_a_wrong_password(client, owner):
    response = client.post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b"errorlist" in response.content


def test_it_renders_the_project_home_with_navigation(owner_client):
    response = owner_client.get("/p/acme/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'hx-headers=\'{"X-CSRFToken"' in html
    assert "/static/vendor/htmx.min.js" in html
    assert "Evaluators" in html


def test_it_hides_another_project_from_an_outsider(outsider_client, project):
    assert outsider_client.get("/p/acme/").status_code == 404
    assert outsider_client.get("/p/acme/settings/").status_code == 404


def test_it_creates_a_project_and_makes_the_creator_owner(outsider_client, outsider):
    response = outsider_client.post("/projects/", {"name": "New One", "slug": "new-one"})
    assert response.status_code == 302
    assert outsider.memberships.get(project__slug="new-one").role == "owner"


def test_it_refuses_a_duplicate_project_slug_inline(owner_client, project):
    response = owner_client.post("/projects/", {"name": "Again", "slug": "acme"})
    assert response.status_code == 200
    assert b"field-error" in response.content


def test_it_shows_a_new_key_once_to_the_owner(owner_client, project):
    response = owner_client.post("/p/acme/settings/", {"name": "laptop", "role": "editor"})
    assert response.status_code == 200
    key = ApiKey.objects.get(name="laptop")
    html = response.content.decode()
    assert f"es_{key.prefix}_" in html
    again = owner_client.get("/p/acme/settings/").content.decode()
    assert f"es_{key.prefix}_…" in again
    assert html.count(f"es_{key.prefix}_") > again.count(f"es_{key.prefix}_") - 1


def test_it_forbids_a_viewer_to_create_keys(viewer_client, project):
    response = viewer_client.post("/p/acme/settings/", {"name": "sneaky", "role": "owner"})
    assert response.status_code == 403
    assert not ApiKey.objects.filter(name="sneaky").exists()


def test_it_revokes_a_key_from_the_settings_page(owner_client, project, owner):
    from evalsite.services import api_key_create

    key, _ = api_key_create(project=project, name="old", created_by=owner)
    response = owner_client.post(f"/p/acme/settings/keys/{key.pk}/revoke")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_it_switches_project_with_a_plain_get(owner_client):
    response = owner_client.get("/projects/go?project=acme")
    assert response.status_code == 302
    assert response.url == "/p/acme/"


def test_it_answers_a_nul_character_in_a_search_with_a_400_page(owner_client, project):
    response = owner_client.get("/p/acme/evaluators/?q=%00x")
    assert response.status_code == 400
    assert "NUL character" in response.content.decode()
