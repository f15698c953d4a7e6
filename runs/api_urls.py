from runs.api import alignment, compare, online, results, review, runs, schemas, testsets, traces

urlpatterns = [
    *compare.urlpatterns,
    *testsets.urlpatterns,
    *traces.urlpatterns,
    *runs.urlpatterns,
    *results.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
    *review.urlpatterns,
    *alignment.urlpatterns,
]
