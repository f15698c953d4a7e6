from django.urls import include, path

from evaluators import views

urlpatterns = [
    path("evaluators/", views.evaluator_list, name="evaluator-list"),
    path("evaluators/new", views.evaluator_new, name="evaluator-new"),
    path("evaluators/<str:ref>/", views.evaluator_detail, name="evaluator-detail"),
    path("evaluators/<str:ref>/save", views.evaluator_save, name="evaluator-save"),
    path("evaluators/<str:ref>/archive", views.evaluator_archive, name="evaluator-archive"),
    path("evaluators/<str:ref>/try", views.evaluator_try, name="evaluator-try"),
    path("evaluators/<str:ref>/diff", views.evaluator_diff, name="evaluator-diff"),
    path("", include("evaluators.connections_views")),
]
