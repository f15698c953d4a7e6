from runs.views import compare, online, runs, scenarios, schemas, testsets, traces

urlpatterns = [
    *compare.urlpatterns,
    *testsets.urlpatterns,
    *traces.urlpatterns,
    *runs.urlpatterns,
    *scenarios.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
]
