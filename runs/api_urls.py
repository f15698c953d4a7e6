from runs.api import compare, online, results, runs, schemas, testsets, traces

urlpatterns = [
    *compare.urlpatterns,
    *testsets.urlpatterns,
    *traces.urlpatterns,
    *runs.urlpatterns,
    *results.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
]
