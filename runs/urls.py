from runs.views import online, runs, scenarios, schemas, testsets, traces

urlpatterns = [*testsets.urlpatterns, *traces.urlpatterns, *runs.urlpatterns, *scenarios.urlpatterns, *online.urlpatterns, *schemas.urlpatterns]
