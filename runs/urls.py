from runs.views import runs, testsets, traces

urlpatterns = [*testsets.urlpatterns, *traces.urlpatterns, *runs.urlpatterns]
