from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from evalsite import api, home, views

router = SimpleRouter(trailing_slash=False)
router.register("api-keys", api.ApiKeyViewSet, basename="api-key")

api_v1 = [
    path("project", api.current_project, name="api-project"),
    path("", include("evaluators.api_urls")),
    path("", include("runs.api_urls")),
    *router.urls,
]

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("projects/", views.project_list, name="project-list"),
    path("projects/go", views.project_go, name="project-go"),
    path("p/<slug:slug>/", home.project_home, name="project-home"),
    path("p/<slug:slug>/settings/", views.project_settings, name="project-settings"),
    path("p/<slug:slug>/settings/spend-cap", views.project_spend_cap, name="project-spend-cap"),
    path(
        "p/<slug:slug>/settings/trace-retention",
        views.project_trace_retention,
        name="project-trace-retention",
    ),
    path(
        "p/<slug:slug>/settings/keys/<int:key_id>/revoke",
        views.api_key_revoke,
        name="api-key-revoke",
    ),
    path("p/<slug:slug>/", include("evaluators.urls")),
    path("p/<slug:slug>/", include("runs.urls")),
    path("healthz", api.healthz, name="healthz"),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[]), name="schema"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[]),
        name="api-docs",
    ),
    path("admin/", admin.site.urls),
]

handler400 = "evalsite.views.bad_request"
