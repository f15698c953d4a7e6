from runs.api import compare, online, runs, schemas, testsets, traces

urlpatterns = [
    *compare.urlpatterns,
    *testsets.urlpatterns,
    *traces.urlpatterns,
    *runs.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
]
