from runs.api import online, runs, schemas, testsets, traces

urlpatterns = [*testsets.urlpatterns, *traces.urlpatterns, *runs.urlpatterns, *online.urlpatterns, *schemas.urlpatterns]
