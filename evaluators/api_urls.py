from django.urls import include, path
from rest_framework.routers import SimpleRouter

from evaluators import api

router = SimpleRouter(trailing_slash=False)
router.register("evaluators", api.EvaluatorViewSet, basename="api-evaluator")

urlpatterns = [
    # Before the router, so "invoke" is not read as an evaluator's slug.
    path("evaluators/invoke", api.invoke, name="evaluator-invoke"),
    path("kinds", api.kind_list, name="kind-list"),
    path("kinds/<str:key>", api.kind_detail, name="kind-detail"),
    path("revisions/<str:ref>", api.revision_detail, name="revision-detail"),
    path("", include("evaluators.connections_api")),
    *router.urls,
]
