from runs.api import online, runs, testsets, traces

urlpatterns = [*testsets.urlpatterns, *traces.urlpatterns, *runs.urlpatterns, *online.urlpatterns]
