"""/healthz, the OpenAPI schema and Swagger UI served without a CDN."""


def test_it_reports_database_and_broker_ok(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "broker": "ok"}


def test_it_reports_an_unreachable_broker_as_503_without_saying_why(client, db, settings):
    settings.CELERY_BROKER_URL = "redis://:s3cret-pw@127.0.0.1:1/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"database": "ok", "broker": "failing"}
    assert b"s3cret" not in response.content and b"127.0.0.1" not in response.content


def test_it_renders_the_openapi_schema(client, db):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert "/api/v1/evaluators/invoke" in schema["paths"]
    assert "ApiKey" in schema["components"]["securitySchemes"]


def test_it_serves_swagger_ui_from_our_static_files(client, db):
    html = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower()
